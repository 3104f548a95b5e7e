// MLA decode attention with absorbed weights over the paged latent cache
// (MlaDecodeParams in params.h states the math). FlashMLA-class split-KV
// design: each CTA streams whole cache blocks of one sequence through shared
// memory with bulk async copies and runs both products on the tensor cores
// (mma.m16n8k16, 16 heads per CTA); a combine kernel merges the splits.
#ifndef MOESH_KERNELS_CUDA_MLA_DECODE_H_
#define MOESH_KERNELS_CUDA_MLA_DECODE_H_

#include <cstddef>

#include "absl/status/status.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

struct MlaDecodePlan {
  int num_splits = 1;          // KV splits per (sequence, head group)
  size_t workspace_bytes = 0;  // device scratch RunMlaDecode needs
};

// How to split a batch: every sequence's cache blocks are cut into
// num_splits ranges, chosen so the CTAs fill the device's num_sms in as few
// waves as possible. Pure host arithmetic; call it once per batch shape.
// An FP8 cache (kv_dtype) runs the 64-head FP8 kernel from 64 heads up and
// with the 64-head shape (mla_decode_wide.cu: each tile widened to bf16 once
// for 64 heads), else the 16-head FP8 kernel (mla_decode_fp8.cu: codes
// straight into f16 MMAs; kDefault resolving to mla::kFp8DefaultTile): plan
// with the dtype it runs.
MlaDecodePlan PlanMlaDecode(int batch, int num_heads, int max_seq_len, int num_sms,
                            MlaTileConfig tile = MlaTileConfig::kDefault,
                            KvCacheDtype kv_dtype = KvCacheDtype::kBf16);

// Workspace a given split count needs (0 for one split).
size_t MlaDecodeWorkspaceBytes(int batch, int num_heads, int num_splits);

// REQUIRES (else INVALID_ARGUMENT): kv_lora_rank == 512, rope_dim == 64,
// kv_row_stride 0 or the row's (576, or 328 for FP8 rows of 656 bytes) —
// except on bf16 rows with a 16-head tile (kTokens*) and on FP8 rows with
// the 64-head tile (kHeads64Tokens64Stages2), which also read wider rows (a
// multiple of 8 units of 2 bytes) and a selection (kv_index, its stride >=
// max_seq_len; seq_lens then counts the selected rows, each a position
// below the sequence's length in the pool),
// 1 <= num_splits <= mla::kMaxSplits with MlaDecodeWorkspaceBytes() of
// workspace (PlanMlaDecode gives both), 16-byte aligned q, kv_cache, out and
// workspace, max_seq_len <= max_blocks_per_seq * 64.
// Every block_table entry a sequence reaches must be in [0, num_blocks).
absl::Status RunMlaDecode(const MlaDecodeParams& p);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_MLA_DECODE_H_
