// A batch of bf16 GEMMs at decode sizes (bf16_gemv.cu): MLA's absorbed
// W_UK / W_UV per head at up to kBf16GemvMaxRows rows, one launch on the
// tensor cores, every weight byte read once, programmatically launched with
// the weights pulled into L2 before its wait (pdl.cuh). ForwardContext::Batched
// takes it where Bf16GemvFits (and CudaModelOptions::bf16_gemv), else
// cuBLASLt's batched GEMM.
#ifndef MOESH_KERNELS_CUDA_BF16_GEMV_H_
#define MOESH_KERNELS_CUDA_BF16_GEMV_H_

#include "absl/status/status.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

inline constexpr int kBf16GemvMaxRows = 8;

// Whether RunBf16Gemv takes p: 1 <= m <= kBf16GemvMaxRows, w as [n, ldw]
// (not w_kn), k a multiple of 32, ldx, ldw and the batch strides multiples
// of 8 (16-byte rows), x and w set and 16-byte aligned, y set, ldy >= n.
bool Bf16GemvFits(const BatchedGemmParams& p);

// BatchedGemmParams' product for every batch entry b:
//   y_b[t, j] (+)= Σ_k x_b[t, k] · w_b[j, k], fp32 sums, bf16 or fp32 out.
// The sums run in a fixed order (deterministic), another than cuBLAS's.
// INVALID_ARGUMENT unless Bf16GemvFits(p) (ldy 0: n).
absl::Status RunBf16Gemv(const BatchedGemmParams& p);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_BF16_GEMV_H_
