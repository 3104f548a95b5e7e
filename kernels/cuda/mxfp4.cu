// MXFP4 quantization: one thread per 32-input block (a row's 16 bytes of
// codes and its scale byte), the block's max magnitude picking the ue8m0
// scale, each value rounded to the nearest e2m1 (ties to the even code), as
// kernels/cpu/mxfp4.cc does.
#include "absl/strings/str_cat.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mxfp4.h"

namespace moesh::cuda {
namespace {

constexpr int kThreadsPerCta = 256;
constexpr int kBlock = 32;  // cpu::kMxfp4Block

// The smallest e with amax <= 6 * 2^(e - 127), in [0, 254]; 127 for 0; 255
// for a non-finite amax (cpu::Mxfp4ScaleFor).
__device__ uint32_t ScaleFor(float amax) {
  if (!isfinite(amax)) return 0xFFu;
  if (amax == 0.0f) return 127u;
  int e = static_cast<int>(ceilf(log2f(amax / 6.0f)));
  while (ldexpf(6.0f, e) < amax) ++e;  // 6 * 2^e is exact: the comparisons are
  while (ldexpf(6.0f, e - 1) >= amax) --e;
  return static_cast<uint32_t>(min(max(e + 127, 0), 254));
}

// The nearest e2m1 code of x (ties to the even code), saturating (F32ToE2M1).
__device__ uint32_t ToE2M1(float x) {
  if (isnan(x)) return 0;
  const uint32_t sign = signbit(x) ? 8u : 0u;
  const float a = fabsf(x);
  const float grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  uint32_t best = 7;
  if (a < 6.0f) {
#pragma unroll
    for (uint32_t c = 0; c < 7; ++c) {
      const float lo = grid[c], hi = grid[c + 1];
      if (a > hi) continue;
      const float mid = 0.5f * (lo + hi);
      best = a < mid ? c : (a > mid ? c + 1 : (c % 2 == 0 ? c : c + 1));
      break;
    }
  }
  return sign | best;
}

__global__ void __launch_bounds__(kThreadsPerCta)
    QuantizeMxfp4Kernel(const bf16* __restrict__ w, uint8_t* __restrict__ q,
                        uint8_t* __restrict__ scale, int64_t blocks) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kThreadsPerCta + threadIdx.x;
  if (b >= blocks) return;  // a row's blocks are consecutive: block b is inputs [32 b, 32 b + 32)
  float v[kBlock];
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < kBlock; ++i) {
    v[i] = __bfloat162float(w[b * kBlock + i]);
    amax = fmaxf(amax, fabsf(v[i]));  // a NaN or infinity: the block's scale is 0xFF (below)
  }
  bool finite = true;
#pragma unroll
  for (int i = 0; i < kBlock; ++i) finite = finite && isfinite(v[i]);
  const uint32_t e = finite ? ScaleFor(amax) : 0xFFu;
  scale[b] = static_cast<uint8_t>(e);
  // 1 / 2^(e - 127), exact (2^-127 is a float subnormal; its inverse 2^127).
  const float inv = e == 0xFFu ? 0.0f : ldexpf(1.0f, 127 - static_cast<int>(e));
  uint8_t* out = q + b * (kBlock / 2);
#pragma unroll
  for (int i = 0; i < kBlock; i += 2) {
    out[i / 2] = static_cast<uint8_t>(ToE2M1(v[i] * inv) | (ToE2M1(v[i + 1] * inv) << 4));
  }
}

}  // namespace

absl::Status RunQuantizeMxfp4(const QuantizeMxfp4Params& p) {
  if (p.n <= 0 || p.k <= 0 || p.k % kBlock != 0 || !p.w || !p.q || !p.scale) {
    return absl::InvalidArgumentError(absl::StrCat("RunQuantizeMxfp4: n ", p.n, ", k ", p.k,
                                                   ": need n, k > 0, k % 32 == 0, w, q, scale"));
  }
  const int64_t blocks = static_cast<int64_t>(p.n) * (p.k / kBlock);
  const int64_t grid = (blocks + kThreadsPerCta - 1) / kThreadsPerCta;
  QuantizeMxfp4Kernel<<<static_cast<unsigned>(grid), kThreadsPerCta, 0, p.stream>>>(
      p.w, p.q, p.scale, blocks);
  return LaunchStatus("QuantizeMxfp4Kernel");
}

}  // namespace moesh::cuda
