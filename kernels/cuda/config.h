// Compile-time tile configurations of the CUDA kernels.
#ifndef MOESH_KERNELS_CUDA_CONFIG_H_
#define MOESH_KERNELS_CUDA_CONFIG_H_

#include "kernels/cuda/tile_config.h"

namespace moesh::cuda {

// Paged latent KV cache: tokens per block.
inline constexpr int kKvBlockSize = 64;

// Row-wise ops (RMSNorm, SiLU-and-mul): threads per row and elements per
// 16-byte vector access.
namespace rowwise {
inline constexpr int kThreads = 256;
inline constexpr int kVec = 8;  // bf16 per 16 bytes
}  // namespace rowwise

// MoE gate: one warp per token.
namespace gate {
inline constexpr int kWarpsPerBlock = 4;
inline constexpr int kMaxExperts = 512;
inline constexpr int kMaxTopK = 32;
inline constexpr int kMaxGroups = 32;
}  // namespace gate

// Greedy argmax + top-k log-probabilities: one block per row.
namespace sampling {
inline constexpr int kThreads = 512;
inline constexpr int kMaxTopK = 20;
// Temperatures below this sample greedily (common/engine/sampler.h's
// kMinSamplingTemperature; model/sample_rows.cc checks they agree).
inline constexpr float kMinTemperature = 1e-5f;
}  // namespace sampling

// MLA decode over the paged latent cache (absorbed weights).
namespace mla {
inline constexpr int kLatentDim = 512;                  // kv_lora_rank
inline constexpr int kRopeDim = 64;                     // qk_rope_head_dim
inline constexpr int kHeadDim = kLatentDim + kRopeDim;  // 576: q·k width, one cache row
inline constexpr int kHeadsPerBlock = 16;               // the M of mma.m16n8k16
inline constexpr int kWarps = 4;
inline constexpr int kThreads = kWarps * 32;
// Shared-memory row pitch of a cached token: 16 bytes of padding make the
// eight rows an ldmatrix reads land in eight different bank groups.
inline constexpr int kRowPitch = kHeadDim + 8;  // bf16 elements
// Tile shapes (tokens per tile × shared-memory stages) the kernel is built
// for; MlaTileConfig in params.h names them. The tuned default (NOTES.md:
// two CTAs per SM beat one CTA with deeper pipelines, 97% vs 64% of copy BW):
inline constexpr MlaTileConfig kDefaultTile = MlaTileConfig::kTokens32Stages2;
// An FP8 cache's (mla_decode_fp8.cu; BENCHMARKS.md, 2026-12-05: 64x2 is the
// fastest at 16 heads from batch 32 up, all tiles tie at batch 1).
inline constexpr MlaTileConfig kFp8DefaultTile = MlaTileConfig::kTokens64Stages2;
inline constexpr int kMaxSplits = 64;
// The wide kernel (MlaTileConfig::kHeads64Tokens64Stages2, mla_decode_wide.cu):
// 64 heads per CTA (the M of wgmma), two warpgroups, 64-token tiles.
inline constexpr int kWideHeads = 64;
inline constexpr int kWideThreads = 256;
}  // namespace mla

// MLA prefill attention in the expanded form (mla_prefill.cu): per head,
// q·k over the 128 no-rope dims and the 64 shared rope dims, 128-wide values
// (DeepSeek-V2, V2-Lite, V3/R1); 64 queries per CTA (four warps of 16 rows),
// 64-key tiles in two shared-memory stages.
namespace mla_prefill {
inline constexpr int kNopeDim = 128;                // qk_nope_head_dim
inline constexpr int kRopeDim = 64;                 // qk_rope_head_dim
inline constexpr int kQkDim = kNopeDim + kRopeDim;  // 192
inline constexpr int kVDim = 128;                   // v_head_dim
inline constexpr int kTileQ = 64;
inline constexpr int kTileK = 64;
inline constexpr int kWarps = kTileQ / 16;
inline constexpr int kThreads = kWarps * 32;
}  // namespace mla_prefill

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_CONFIG_H_
