// DeepSeek's block-scaled FP8 on the GPU: the activations' on-the-fly
// quantization (per row per 128 columns) and the weights' (per 128 x 128
// block, at load). The block-scaled GEMM itself is
// cuBLASLt's (CublasGemm::RunFp8, gemm.h), or at decode sizes our own
// (RunFp8Gemv). Reference: kernels/cpu/fp8.h.
#ifndef MOESH_KERNELS_CUDA_FP8_H_
#define MOESH_KERNELS_CUDA_FP8_H_

#include "absl/status/status.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

// INVALID_ARGUMENT unless m >= 0, k > 0 a multiple of 16 (cuBLASLt's FP8
// GEMM needs it too), ldx >= k a multiple of 8, x 16-byte aligned.
absl::Status RunQuantizeFp8(const QuantizeFp8Params& p);

// INVALID_ARGUMENT unless n, k > 0, exactly one input, q and scale set.
absl::Status RunQuantizeFp8Blocks(const QuantizeFp8BlocksParams& p);

// Fp8GemmParams' product at decode sizes on the tensor cores (fp8_gemv.cu:
// the weight rows as the MMA's M, each weight byte read once), writing rows
// [0, m) of y only (no padding to Fp8Rows(m)). The same math as
// CublasGemm::RunFp8; the sums in another order. INVALID_ARGUMENT unless
// 1 <= m <= kFp8GemvMaxRows, n >= 1, k a positive multiple of 64, ldy >= n
// (0: n), x and w 16-byte aligned. With x_bf16 set it quantizes x itself
// (RunQuantizeFp8's codes and scales, bit for bit: the same y) — then
// x_bf16 16-byte aligned, ldx >= k a multiple of 8 (0: k), and y not
// overlapping x_bf16 (CTAs write y while others still read x). Every CTA (16 weight
// rows) quantizes all of x again, so x_bf16 pays up to
// kFp8GemvQuantizeMaxN rows of w: past them, separate quantization (H100,
// V3 layer shapes with q_b's 24576 rows fused: batch 1 2.077 -> 2.183 ms).
inline constexpr int kFp8GemvQuantizeMaxN = 4096;
inline constexpr int kFp8GemvMaxRows = 8;
// Past this k the GEMV's CTAs (16 weight rows, four warps splitting k) hold
// too few bytes in flight and cuBLASLt's split GEMM is faster (kernel_bench
// --fp8 on an H100: o_proj k 16384 57.7 against 51.8 us, dense down k 18432
// 63.4 against 57.1; q_a + kv_a k 7168 11.5 against 16.5). The model's choice.
inline constexpr int kFp8GemvMaxK = 8192;
absl::Status RunFp8Gemv(const Fp8GemmParams& p);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_FP8_H_
