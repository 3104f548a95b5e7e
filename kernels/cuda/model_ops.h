// The ops the CUDA forward pass adds to kernels/cuda: embedding, fp32-residual
// RMSNorm, strided slice copy, MoE permutation / grouped GEMM / combine, and
// a plain MLA attention kernel for any latent and rope widths.
//
// Each checks shapes once, launches on params.stream and returns
// INVALID_ARGUMENT for bad arguments or INTERNAL carrying the CUDA error.
#ifndef MOESH_KERNELS_CUDA_MODEL_OPS_H_
#define MOESH_KERNELS_CUDA_MODEL_OPS_H_

#include "absl/status/status.h"
#include "kernels/cuda/model_params.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

absl::Status RunEmbed(const EmbedParams& p);
absl::Status RunRmsNormF32(const RmsNormF32Params& p);
absl::Status RunSliceCopy(const SliceCopyParams& p);

// REQUIRES: num_experts <= 1024, tile_m in {16, 32, 64}.
absl::Status RunMoePermute(const MoePermuteParams& p);
// REQUIRES: k % 32 == 0, n % 8 == 0, ldx % 8 == 0, 16-byte aligned x and w,
// tile_m in {16, 32, 64} and equal to the permutation's.
absl::Status RunGroupedGemm(const GroupedGemmParams& p);
// The most tiles `rows` permuted rows can need: ceil(rows / tile_m) + min(num_experts, rows).
int GroupedGemmMaxTiles(int rows, int num_experts, int tile_m);
// MXFP4 weights: the grouped GEMM's MMAs take each 32-input group's inputs in
// this order (slot s of a group holds its input Mxfp4MmaInput(s)), so that a
// thread's four B registers are the nibbles of one 32-bit load; the bf16
// kernel run on x and w with each group's inputs so permuted gives the same
// bits.
constexpr int Mxfp4MmaInput(int slot) {
  return 8 * ((slot % 8) / 2) + 2 * (slot / 16) + (slot % 16) / 8 + 4 * (slot % 2);
}
absl::Status RunMoeCombine(const MoeCombineParams& p);
// REQUIRES: cols and ldx multiples of 8, 16-byte aligned x and out.
absl::Status RunGatherRows(const GatherRowsParams& p);
// REQUIRES: latent + rope, row_stride and ldo multiples of 8, 16-byte aligned
// cache and out; FP8 rows: latent a multiple of 16 (whole scale groups of
// 128 past the first), row_stride at least the FP8 row's.
absl::Status RunGatherKvRows(const GatherKvRowsParams& p);
// REQUIRES: block_elems and the layer strides multiples of 8, 16-byte aligned pools.
absl::Status RunCopyKvBlocks(const CopyKvBlocksParams& p);

// MlaDecodeParams' math for any kv_lora_rank + rope_dim <= 1024, in fp32, one
// CTA per (query row, head), no splits (num_splits and workspace ignored).
// For shapes the tuned kernel (RunMlaDecode: 512 + 64) is not built for,
// e.g. the golden test checkpoints; out_type bf16 or fp32; lse may be null.
absl::Status RunMlaAttentionGeneric(const MlaDecodeParams& p);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_MODEL_OPS_H_
