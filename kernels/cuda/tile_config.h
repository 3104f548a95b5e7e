// The MLA kernels' shapes (decode tiles, the prefill kernel), named for
// params and config alike.
#ifndef MOESH_KERNELS_CUDA_TILE_CONFIG_H_
#define MOESH_KERNELS_CUDA_TILE_CONFIG_H_

namespace moesh::cuda {

// Tokens per tile × shared-memory stages of the MLA decode kernel. A 64-token
// tile is one cache block; 32 is half of one. The kTokens* shapes put 16 heads
// in a CTA (mma.sync); kHeads64* puts 64 (wgmma, the wide heads of V2/V3).
enum class MlaTileConfig {
  kDefault,  // kHeads64Tokens64Stages2 from 64 heads up, else mla::kDefaultTile (config.h)
  kTokens64Stages2,
  kTokens32Stages4,
  kTokens32Stages5,
  kTokens32Stages2,  // small enough for two CTAs per SM
  // Over FP8 rows the same kernel's producer widens each tile from registers
  // into the bf16 stages (mla_decode_wide.cu's kFp8).
  kHeads64Tokens64Stages2,
};

// Which kernel runs RunMlaPrefill (mla_prefill.h): mma.sync (64 queries a
// CTA, four warps; mla_prefill.cu) or wgmma (128 queries a CTA, two consumer
// warpgroups fed by a TMA producer; mla_prefill_wgmma.cu).
enum class MlaPrefillImpl { kMmaSync, kWgmma };

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_TILE_CONFIG_H_
