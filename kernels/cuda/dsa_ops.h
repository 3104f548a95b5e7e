// DeepSeek's lightning indexer on the GPU: DeepSeek-V3.2's DSA (over every
// causal cache row) and DeepSeek-V4's CSA layers (over the compressed
// entries), and V3.2's indexer key written into the cache row. CPU
// references: kernels/cpu/dsa_indexer.h (V3.2; the key in
// common/model/attention_model.cc IndexerProject) and
// common/model/v4/v4_model.cc (V4).
//
// Conventions as model_ops.h: each op checks shapes once, launches on
// params.stream, never synchronises or allocates (graph-capturable), and
// returns INVALID_ARGUMENT for bad arguments or INTERNAL with the CUDA error.
#ifndef MOESH_KERNELS_CUDA_DSA_OPS_H_
#define MOESH_KERNELS_CUDA_DSA_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

// For token t (position seq_lens[t] - 1) and its visible = seq_lens[t] / rate
// keys k[0 .. visible) (rate 1: every causal row),
//   score[e] = sum_h relu(q[t, h] . k[e]) * scale * w[t, h] * w_scale
// and the top_k best (ties: the earlier key; -0 counts as 0), or all of them
// if visible <= top_k: selected[t, 0 : count[t]], in no particular order.
// Key e of token t is row e of its sequence (through its block table) in
// key_cache (bf16, at key_row_width * row + key_offset): V3.2's cache rows
// (rate 1), or V4's entry pool (its CSA layers' index entries, rate 4).
struct IndexerParams {
  const bf16* q = nullptr;  // [num_tokens, num_heads * head_dim], roped
  const bf16* w = nullptr;  // [num_tokens, ldw] per-head weights
  int ldw = 0;
  float w_scale = 1.0f, scale = 1.0f;
  int num_tokens = 0, num_heads = 0, head_dim = 0;
  int rate = 1, top_k = 0;
  const int32_t* seq_lens = nullptr;  // [num_tokens]
  const bf16* key_cache = nullptr;
  int key_row_width = 0, key_offset = 0;
  const int32_t* block_table = nullptr;  // [num_tokens, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  float* scores = nullptr;      // scratch [num_tokens, max_keys]
  int max_keys = 0;             // >= every token's visible
  int32_t* selected = nullptr;  // [num_tokens, top_k]
  int32_t* count = nullptr;     // [num_tokens]
  // The scores on the tensor cores (64 heads × 128 dims only: DeepSeek's
  // indexers), else on the CUDA cores; the same math, sums in another order.
  bool tensor_cores = false;
  cudaStream_t stream = nullptr;
};
// REQUIRES: 1 <= num_heads <= 64, num_heads * head_dim <= 8192; tensor_cores:
// 64 heads of 128 dims, 16-byte aligned q and key_cache, key_row_width and
// key_offset multiples of 8.
absl::Status RunIndexer(const IndexerParams& p);

// V3.2's indexer key of each token with slot_mapping[t] >= 0:
//   k = LayerNorm(src[t, 0 : dim]; weight, bias, eps), the first rope.dim
//   values roped (rope.layout) at positions[t], as bf16 at
//   cache[slot * row_width + offset ...].
struct IndexKeyParams {
  const bf16* src = nullptr;  // [num_tokens, ld_src]
  int ld_src = 0;
  int num_tokens = 0, dim = 0;
  const float* weight = nullptr;  // [dim]
  const float* bias = nullptr;    // [dim]
  float eps = 1e-6f;
  const int32_t* positions = nullptr;
  const int32_t* slot_mapping = nullptr;
  bf16* cache = nullptr;
  int row_width = 0, offset = 0;
  RopeTableView rope;
  cudaStream_t stream = nullptr;
};
// REQUIRES: dim <= 1024, rope.dim <= dim, offset + dim <= row_width.
absl::Status RunIndexKey(const IndexKeyParams& p);

// The pool rows of each token's selection, for a gather into a dense copy:
// rows[t, j] = the physical row (block_table[t, pos / 64] * 64 + pos % 64)
// of pos = selected[t, j] for j < count[t], else 0 (a valid row nobody reads),
// for j in [0, stride).
struct SelectedRowsParams {
  const int32_t* selected = nullptr;  // [num_tokens, top_k]
  const int32_t* count = nullptr;     // [num_tokens]
  int num_tokens = 0, top_k = 0, stride = 0;
  const int32_t* block_table = nullptr;  // [num_tokens, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  int32_t* rows = nullptr;  // [num_tokens, stride]
  cudaStream_t stream = nullptr;
};
// REQUIRES: stride >= top_k.
absl::Status RunSelectedRows(const SelectedRowsParams& p);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_DSA_OPS_H_
