// DeepSeek-V4's pieces of the CUDA forward pass: mHC (the hc_mult residual
// streams' collapse before each sublayer and expansion after it), the
// attention's per-head norm + partial RoPE, the cache row write, the
// compressors' pooled entries and the shared-KV attention with sinks over a sliding window plus
// compressed entries (the CSA layers' lightning indexer is dsa_ops.h's). The CPU references:
// kernels/cpu/mhc.h (mHC) and common/model/v4/v4_model.cc (everything else; its comments give the
// math and the cache row layout, which these kernels share).
//
// Every token row t of a pass carries seq_lens[t] = its position + 1 (0: a
// padding row, which writes zeros and no cache row) and its block table row.
// Compressed entries live in an entry pool beside the KV pool (the same block
// ids; entry e of a sequence at its row e), computed once each, when the
// pass that completes their window runs (its own rows written first).
//
// Each op checks shapes once, launches on params.stream and returns
// INVALID_ARGUMENT for bad arguments or INTERNAL carrying the CUDA error. No
// op synchronises, allocates or reads a host value: a decode pass replays as
// a CUDA graph.
#ifndef MOESH_KERNELS_CUDA_V4_OPS_H_
#define MOESH_KERNELS_CUDA_V4_OPS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

// mHC before a sublayer (kernels/cpu/mhc.h RunMhcPre), given
// mix = flatten(x) · fn^T from an fp32 GEMM: per token (row r = rows ? rows[i] : i)
//   m = mix[r] * rsqrt(mean(x[r]^2) + norm_eps)      (the unweighted RMSNorm)
//   pre, post, comb from m, base, scale (Sinkhorn on comb), and
//   collapsed[i] = sum_j pre[j] * x[r, j].
// head: mix has hc columns, only pre is formed (the final hc head, RunMhcHead);
// post and comb are not written.
struct MhcPreParams {
  const float* x = nullptr;       // [*, hc, hidden]
  const float* mix = nullptr;     // [*, n_mix]; n_mix = head ? hc : (2 + hc) * hc
  const int32_t* rows = nullptr;  // [num_tokens]; may be null (identity)
  const float* base = nullptr;    // [n_mix]
  const float* scale = nullptr;   // [head ? 1 : 3]
  int num_tokens = 0, hc = 0, hidden = 0;
  bool head = false;
  int sinkhorn_iters = 1;
  float hc_eps = 1e-6f, norm_eps = 1e-6f;
  float* collapsed = nullptr;  // [num_tokens, hidden]
  float* post = nullptr;       // [num_tokens, hc]
  float* comb = nullptr;       // [num_tokens, hc, hc]
  cudaStream_t stream = nullptr;
};
// REQUIRES: 1 <= hc <= 8.
absl::Status RunMhcPre(const MhcPreParams& p);

// x[t, k, :] = post[t, k] * y[t, :] + sum_j comb[t, j, k] * x[t, j, :], in place.
struct MhcPostParams {
  float* x = nullptr;        // [num_tokens, hc, hidden]
  const float* y = nullptr;  // [num_tokens, hidden]
  const float* post = nullptr;
  const float* comb = nullptr;
  int num_tokens = 0, hc = 0, hidden = 0;
  cudaStream_t stream = nullptr;
};
absl::Status RunMhcPost(const MhcPostParams& p);

// Per token t and head r of x[t, r*dim : (r+1)*dim] (bf16, in place):
// optionally an unweighted RMSNorm (eps), then RoPE (interleaved pairs) of the
// trailing rope.dim dims at position seq_lens[t] - 1.
struct V4HeadsParams {
  bf16* x = nullptr;  // [num_tokens, ldx]
  int ldx = 0;
  int num_tokens = 0, num_heads = 0, dim = 0;
  bool normalize = false;
  float eps = 1e-6f;
  const int32_t* seq_lens = nullptr;  // [num_tokens]
  RopeTableView rope;
  cudaStream_t stream = nullptr;
};
// REQUIRES: dim even, <= 1024; rope.dim <= dim.
absl::Status RunV4Heads(const V4HeadsParams& p);

// The cache row of each token with slot_mapping[t] >= 0:
//   row = src[t, 0 : width] with its first head_dim values RMSNorm'd
//   (kv_norm, eps) and their trailing rope.dim roped at seq_lens[t] - 1,
//   written as bf16 to cache[slot, 0 : width].
struct V4KvRowParams {
  const bf16* src = nullptr;  // [num_tokens, ld_src]
  int ld_src = 0;
  int num_tokens = 0, width = 0, head_dim = 0;
  const bf16* kv_norm = nullptr;  // [head_dim]
  float eps = 1e-6f;
  const int32_t* seq_lens = nullptr;
  const int32_t* slot_mapping = nullptr;
  bf16* cache = nullptr;  // the layer's [num_blocks * kKvBlockSize, row_width]
  int row_width = 0;
  RopeTableView rope;
  cudaStream_t stream = nullptr;
};
// REQUIRES: width <= row_width, width <= 4096.
absl::Status RunV4KvRow(const V4KvRowParams& p);

// A compressor's entries (v4_model.cc CompressedEntries), cached: entry e of
// a sequence is final once its window's last token is in (e < length / rate),
// so a pass computes only the entries its tokens complete. Segment s (a run
// of one sequence's tokens in the pass) uses token row seg_row[s]'s block
// table and length (its last token's) and held seg_from[s] tokens before
// the pass; for e in [seg_from / rate, seq_lens[seg_row] / rate), entry e
// softmax-pools per feature the window's `series` series of the cache rows
// (gates + ape), RMSNorm (norm, eps), RoPE of the trailing rope.dim at
// position e * rate, written as bf16 to the entry pool at the sequence's
// row e: entries[row(e) * entry_row_width + entry_offset ...].
struct V4CompressParams {
  const bf16* cache = nullptr;
  int row_width = 0;
  const int32_t* block_table = nullptr;  // [num_tokens, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;  // [num_tokens]
  const int32_t* seg_row = nullptr;   // [num_segs]
  const int32_t* seg_from = nullptr;  // [num_segs]
  int num_segs = 0;
  int max_new = 0;  // entries a segment can complete in the pass, at most
  int kv_offset = 0, gate_offset = 0, series = 1, dim = 0, rate = 1;
  const float* ape = nullptr;  // [rate, series * dim]
  const bf16* norm = nullptr;  // [dim]
  float eps = 1e-6f;
  RopeTableView rope;
  bf16* entries = nullptr;  // the layer's entry pool
  int entry_row_width = 0, entry_offset = 0;
  cudaStream_t stream = nullptr;
};
// REQUIRES: series 1 or 2, dim <= 1024, rate >= 1.
absl::Status RunV4Compress(const V4CompressParams& p);

enum class V4Keys { kSlidingOnly, kAllEntries, kSelectedEntries };

// Shared-KV attention of V4 (keys are the values): token t (position
// pos = seq_lens[t] - 1) and head r attend, with the head's sink in the
// softmax's denominator, to cache rows max(0, pos - window + 1) .. pos (their
// first dim values) and then, by `keys`, to no entry, to its sequence's
// entries 0 .. seq_lens[t] / rate - 1, or to selected[t, 0 : count[t]]; the
// output gets the inverse RoPE at pos: out[t, r] (bf16).
struct V4AttentionParams {
  const bf16* q = nullptr;  // [num_tokens, num_heads, dim], normed and roped
  int num_tokens = 0, num_heads = 0, dim = 0;
  const bf16* cache = nullptr;
  int row_width = 0;
  const int32_t* block_table = nullptr;
  int max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;
  int window = 1;
  V4Keys keys = V4Keys::kSlidingOnly;
  const bf16* entries =
      nullptr;  // the layer's entry pool: entry e at row e of the token's sequence
  int entry_row_width = 0, rate = 1;
  const int32_t* selected = nullptr;  // [num_tokens, top_k]
  const int32_t* count = nullptr;
  int top_k = 0;
  const float* sinks = nullptr;  // [num_heads]
  float scale = 1.0f;
  RopeTableView rope;
  bf16* out = nullptr;  // [num_tokens, num_heads * dim]
  cudaStream_t stream = nullptr;
};
// REQUIRES: dim even, <= 512.
absl::Status RunV4Attention(const V4AttentionParams& p);

// The same attention on the tuned MLA kernel (head_dim 512 = its latent
// width): RunV4GatherKeys lays out the keys of tokens [first, first + n) of
// `a` densely, token first + i at rows [i * stride, i * stride + count) of
// `keys` ([*, out_width] bf16: the key's dim values, then zeros), count =
// key_count[first + i] (0 for padding rows); the MLA kernel attends with
// values = the keys' first 512 dims (all of them) and reports each head's
// log-sum-exp; RunV4AttnFinish puts the sink in the denominator,
//   out[t, h] = bf16(inverse RoPE at -pos of o[t, h] / (1 + exp(sink[h] - lse[t, h]))),
// zeros for padding rows.
// REQUIRES: a.dim % 8 == 0, out_width >= a.dim and a multiple of 8, every
// token's window + entries <= stride.
absl::Status RunV4GatherKeys(const V4AttentionParams& a, int first, int n, int stride,
                             int out_width, bf16* keys, int32_t* key_count);
struct V4AttnFinishParams {
  const float* o = nullptr;    // [num_tokens, num_heads, dim]
  const float* lse = nullptr;  // [num_tokens, num_heads]
  const float* sinks = nullptr;
  const int32_t* seq_lens = nullptr;
  int num_tokens = 0, num_heads = 0, dim = 0;
  RopeTableView rope;
  bf16* out = nullptr;  // [num_tokens, num_heads * dim]
  cudaStream_t stream = nullptr;
};
absl::Status RunV4AttnFinish(const V4AttnFinishParams& p);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_V4_OPS_H_
