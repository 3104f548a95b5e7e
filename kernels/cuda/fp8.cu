// Per-row, per-128-column FP8 quantization: one warp per (row, block), four
// values a lane; the block's max magnitude by a warp reduction.
#include <cuda_fp8.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/fp8_quant.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pdl.cuh"

namespace moesh::cuda {
namespace {

constexpr int kWarps = 8;  // per CTA

__global__ void __launch_bounds__(kWarps * 32)
    QuantizeFp8Kernel(const bf16* __restrict__ x, const int32_t* __restrict__ index,
                      const int32_t* __restrict__ count, uint8_t* __restrict__ q,
                      float* __restrict__ scale, int m, int rows, int k, int ldx) {
  PdlBegin();
  const int blocks = cpu::Fp8Blocks(k);
  const int64_t task = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (task >= static_cast<int64_t>(rows) * blocks) return;
  // Neighbouring warps take neighbouring rows of one column block: their
  // scales (column-major) go out together.
  const int b = static_cast<int>(task / rows), row = static_cast<int>(task % rows);
  const int lane = threadIdx.x & 31;
  const int c = b * cpu::kFp8Block + lane * 4;  // k % 16 == 0: four in or four out
  float v[4] = {0, 0, 0, 0};
  const int valid = count != nullptr ? min(m, *count) : m;
  if (c < k && row < valid) {  // rows past m (or *count): zeros
    const int64_t src = index != nullptr ? index[row] : row;
    const uint2 raw = *reinterpret_cast<const uint2*>(x + src * ldx + c);
    const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
    const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
    v[0] = lo.x, v[1] = lo.y, v[2] = hi.x, v[3] = hi.y;
  }
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  const float s = fp8q::BlockScale(WarpMax(amax));
  if (lane == 0) scale[static_cast<int64_t>(b) * rows + row] = s;
  if (c < k) {
    uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      packed |= fp8q::Code(v[j], s) << (8 * j);
    }
    *reinterpret_cast<uint32_t*>(q + static_cast<int64_t>(row) * k + c) = packed;
  }
}

// One CTA per 128 x 128 block: thread t walks column t % 128 of every other
// row (coalesced), the block's max magnitude by a CTA reduction, then a
// second pass writes the codes.
constexpr int kBlockThreads = 256;

__device__ __forceinline__ float Widen(const float* w, int64_t i) { return w[i]; }
__device__ __forceinline__ float Widen(const bf16* w, int64_t i) { return __bfloat162float(w[i]); }

template <typename T>
__global__ void __launch_bounds__(kBlockThreads)
    QuantizeFp8BlocksKernel(const T* __restrict__ w, uint8_t* __restrict__ q,
                            float* __restrict__ scale, int n, int k, int scale_stride) {
  __shared__ float warp_max[kBlockThreads / 32];
  const int bj = blockIdx.y, b = blockIdx.x;
  const int c = b * cpu::kFp8Block + (threadIdx.x % cpu::kFp8Block);
  const int r0 = bj * cpu::kFp8Block + threadIdx.x / cpu::kFp8Block;
  const int r1 = min(n, (bj + 1) * cpu::kFp8Block);
  constexpr int kRowStep = kBlockThreads / cpu::kFp8Block;
  float amax = 0.0f;
  if (c < k) {
    for (int r = r0; r < r1; r += kRowStep)
      amax = fmaxf(amax, fabsf(Widen(w, static_cast<int64_t>(r) * k + c)));
  }
  amax = WarpMax(amax);
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kBlockThreads / 32; ++i) amax = fmaxf(amax, warp_max[i]);
  const float s = fp8q::BlockScale(amax);
  if (threadIdx.x == 0) scale[static_cast<int64_t>(bj) * scale_stride + b] = s;
  if (c >= k) return;
  for (int r = r0; r < r1; r += kRowStep) {
    const int64_t at = static_cast<int64_t>(r) * k + c;
    q[at] = static_cast<uint8_t>(fp8q::Code(Widen(w, at), s));
  }
}

}  // namespace

absl::Status RunQuantizeFp8Blocks(const QuantizeFp8BlocksParams& p) {
  if (p.n <= 0 || p.k <= 0 || (p.w_f32 == nullptr) == (p.w_bf16 == nullptr) || !p.q || !p.scale) {
    return absl::InvalidArgumentError(absl::StrCat("RunQuantizeFp8Blocks: n ", p.n, ", k ", p.k,
                                                   ": need n, k > 0, one input, q and scale"));
  }
  const dim3 grid(cpu::Fp8Blocks(p.k), cpu::Fp8Blocks(p.n));
  // A load-time kernel, often on the legacy default stream (UploadLinear):
  // launched plainly, not programmatically (pdl.cuh).
  if (p.w_f32) {
    QuantizeFp8BlocksKernel<<<grid, kBlockThreads, 0, p.stream>>>(p.w_f32, p.q, p.scale, p.n, p.k,
                                                                  Fp8ScaleStride(p.k));
  } else {
    QuantizeFp8BlocksKernel<<<grid, kBlockThreads, 0, p.stream>>>(p.w_bf16, p.q, p.scale, p.n, p.k,
                                                                  Fp8ScaleStride(p.k));
  }
  return LaunchStatus("QuantizeFp8BlocksKernel");
}

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
  return LaunchPdl("QuantizeFp8Kernel", QuantizeFp8Kernel, static_cast<unsigned>(grid), kWarps * 32,
                   0, p.stream, p.x, p.index, p.count, p.q, p.scale, p.m, Fp8Rows(p.m), p.k, ldx);
}

}  // namespace moesh::cuda
