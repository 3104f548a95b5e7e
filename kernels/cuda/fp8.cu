// Per-row, per-128-column FP8 quantization: one warp per (row, block), four
// values a lane; the block's max magnitude by a warp reduction.
#include <cuda_fp8.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/launch.cuh"

namespace moesh::cuda {
namespace {

constexpr int kWarps = 8;  // per CTA
constexpr float kMinAmax = 1e-10f;

__global__ void __launch_bounds__(kWarps * 32)
    QuantizeFp8Kernel(const bf16* __restrict__ x, uint8_t* __restrict__ q,
                      float* __restrict__ scale, int m, int rows, int k, int ldx) {
  const int blocks = cpu::Fp8Blocks(k);
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (task >= static_cast<int64_t>(rows) * blocks) return;
  // Neighbouring warps take neighbouring rows of one column block: their
  // scales (column-major) go out together.
  const int b = static_cast<int>(task / rows), row = static_cast<int>(task % rows);
  const int lane = threadIdx.x & 31;
  const int c = b * cpu::kFp8Block + lane * 4;  // k % 16 == 0: four in or four out
  float v[4] = {0, 0, 0, 0};
  if (c < k && row < m) {  // rows past m: zeros
    const uint2 raw = *reinterpret_cast<const uint2*>(x + static_cast<int64_t>(row) * ldx + c);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
  }
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  amax = fmaxf(WarpMax(amax), kMinAmax);
  const float s = amax / cpu::kFp8Max;  // IEEE division, as the reference
  if (lane == 0) scale[static_cast<int64_t>(b) * rows + row] = s;
  if (c < k) {
    uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t code = __nv_cvt_float_to_fp8(v[j] / s, __NV_SATFINITE, __NV_E4M3);
      packed |= code << (8 * j);
    }
    *reinterpret_cast<uint32_t*>(q + static_cast<int64_t>(row) * k + c) = packed;
  }
}

}  // namespace

absl::Status RunQuantizeFp8(const QuantizeFp8Params& p) {
  const int ldx = p.ldx ? p.ldx : p.k;
  if (p.m < 0 || p.k <= 0 || p.k % 16 != 0 || ldx < p.k || ldx % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("RunQuantizeFp8: m ", p.m, ", k ", p.k, ", ldx ",
                                                   ldx,
                                                   ": need k > 0 a multiple of 16, ldx >= k a "
                                                   "multiple of 8"));
  }
  if (p.m == 0) return absl::OkStatus();
  if (!p.x || !p.q || !p.scale || (reinterpret_cast<uintptr_t>(p.x) & 15)) {
    return absl::InvalidArgumentError("RunQuantizeFp8: null or unaligned pointer");
  }
  const int64_t tasks = static_cast<int64_t>(Fp8Rows(p.m)) * cpu::Fp8Blocks(p.k);
  const int64_t grid = (tasks + kWarps - 1) / kWarps;
  QuantizeFp8Kernel<<<static_cast<unsigned>(grid), kWarps * 32, 0, p.stream>>>(
      p.x, p.q, p.scale, p.m, Fp8Rows(p.m), p.k, ldx);
  return LaunchStatus("QuantizeFp8Kernel");
}

}  // namespace moesh::cuda
