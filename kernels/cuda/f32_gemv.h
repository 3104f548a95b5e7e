// An fp32 GEMM at decode sizes (f32_gemv.cu): one launch, deterministic.
#ifndef MOESH_KERNELS_CUDA_F32_GEMV_H_
#define MOESH_KERNELS_CUDA_F32_GEMV_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace moesh::cuda {

inline constexpr int kF32GemvMaxRows = 8;
// CublasGemm::RunF32 takes the GEMV from this many columns of y (a CTA
// each): V4's mHC mix (4 and 24 columns) ran slower on it than on cuBLAS
// (BENCHMARKS, twenty-third session); the routers (64-256 experts) faster.
inline constexpr int kF32GemvMinCols = 32;

// y[m, n] = x[m, k] · w[n, k]^T (+ y if accumulate), fp32 math (no TF32),
// rows packed (x's stride k, y's n).
struct F32GemvParams {
  const float* x = nullptr;  // [m, k]
  const float* w = nullptr;  // [n, k]
  float* y = nullptr;        // [m, n]
  int m = 0, n = 0, k = 0;
  bool accumulate = false;
  cudaStream_t stream = nullptr;
};
// INVALID_ARGUMENT unless 1 <= m <= kF32GemvMaxRows, n >= 1, k a positive
// multiple of 4, x and w 16-byte aligned. REQUIRES: y aliases neither x nor w
// (CTAs write y while others still read x).
absl::Status RunF32Gemv(const F32GemvParams& p);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_F32_GEMV_H_
