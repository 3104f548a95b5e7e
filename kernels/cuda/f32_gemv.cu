// y[m, n] = x[m, k] · w[n, k]^T (+ y), fp32, at decode sizes (m <= 8): the
// MoE router (64..256 experts x hidden) and V4's mHC mix (24 x 4 hidden).
// One CTA a column of y: its threads split k in float4 steps (four loads in
// flight a thread), every row's sum by one block reduction in a fixed order
// (deterministic). cuBLAS ran these as a split dot kernel plus a reduction:
// two launches (BENCHMARKS, 2026-12-06: 7.5-8.3 us a router at batch 1).
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/f32_gemv.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pdl.cuh"

namespace moesh::cuda {
namespace {

constexpr int kThreads = 256;

template <int kM>
__global__ void __launch_bounds__(kThreads) F32GemvKernel(F32GemvParams p) {
  __shared__ float scratch[kM][32];
  const int col = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float4* w = reinterpret_cast<const float4*>(p.w + static_cast<int64_t>(col) * p.k);
  // Launched programmatically (pdl.cuh): the column's weights start for L2
  // while the kernel before it (the norm producing x) ends.
  if (threadIdx.x == 0) BulkPrefetchL2(w, static_cast<uint32_t>(p.k) * 4);
  PdlBegin();
  const float4* x = reinterpret_cast<const float4*>(p.x);
  const int k4 = p.k / 4;
  float acc[kM];
#pragma unroll
  for (int t = 0; t < kM; ++t) acc[t] = 0.0f;
#pragma unroll 4
  for (int j = threadIdx.x; j < k4; j += kThreads) {
    const float4 wv = w[j];
#pragma unroll
    for (int t = 0; t < kM; ++t) {
      if (t < p.m) {
        const float4 xv = x[static_cast<int64_t>(t) * k4 + j];
        acc[t] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kM; ++t) {
    float v = acc[t];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) scratch[t][warp] = v;
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int t = 0; t < kM; ++t) {
    float v = lane < kThreads / 32 ? scratch[t][lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0 && t < p.m) {
      float* y = p.y + static_cast<int64_t>(t) * p.n + col;
      *y = p.accumulate ? *y + v : v;
    }
  }
}

}  // namespace

absl::Status RunF32Gemv(const F32GemvParams& p) {
  if (p.m < 1 || p.m > kF32GemvMaxRows || p.n < 1 || p.k < 4 || p.k % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("RunF32Gemv: m ", p.m, ", n ", p.n, ", k ", p.k,
                                                   ": need 1 <= m <= ", kF32GemvMaxRows,
                                                   ", n >= 1, k a positive multiple of 4"));
  }
  if (!p.x || !p.w || !p.y ||
      (reinterpret_cast<uintptr_t>(p.x) | reinterpret_cast<uintptr_t>(p.w)) % 16 != 0) {
    return absl::InvalidArgumentError("RunF32Gemv: null pointer, or x / w not 16-byte aligned");
  }
  return p.m <= 2 ? LaunchPdl("F32GemvKernel", F32GemvKernel<2>, p.n, kThreads, 0, p.stream, p)
                  : LaunchPdl("F32GemvKernel", F32GemvKernel<kF32GemvMaxRows>, p.n, kThreads, 0,
                              p.stream, p);
}

}  // namespace moesh::cuda
