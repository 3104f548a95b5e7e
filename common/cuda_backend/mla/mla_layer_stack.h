// DeepSeek-V2, V2-Lite, V3/R1 and V3.2 on the GPU (layer_stack.h). Per
// layer, for T tokens (T = all new tokens of the pass, flattened):
//   x (fp32 residual) → RMSNorm → [q_a | kv_a] GEMM (→ q_a norm → q_b GEMM)
//   → W_UK absorbed into q (batched GEMM over heads) → kv_a norm + RoPE + paged
//   cache write (q_pe roped too) → (V3.2: the lightning indexer's top-k,
//   mla_layer_stack_dsa.cc) → MLA attention over the cache → W_UV
//   (batched GEMM) → o_proj GEMM accumulated into x → RMSNorm → FfnBlock
//   (dense MLP, or MoE) into x.
//
// Prefill runs the same path, except that a sequence bringing many new
// tokens (CudaModelOptions::mla_prefill) attends in the expanded form
// (mla_layer_stack_prefill.cc): its context's latent rows gathered from the
// cache and expanded by kv_b_proj into per-head keys and values, then the
// FlashAttention-style prefill kernel (kernels/cuda/mla_prefill.h) writes its
// attention output directly (no W_UV). Other rows are absorbed: each token one
// query row attending to cache rows [0, position] (its own row written
// first) through the decode attention kernel.
#ifndef MOESH_COMMON_CUDA_BACKEND_MLA_MLA_LAYER_STACK_H_
#define MOESH_COMMON_CUDA_BACKEND_MLA_MLA_LAYER_STACK_H_

#include <algorithm>
#include <memory>
#include <vector>

#include "common/cuda_backend/attention_scratch.h"
#include "common/cuda_backend/layer_stack.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

// A run of a pass's token rows attended one way: absorbed (rows of any
// sequences, through the decode kernel with `plan`), or expanded (one
// sequence's new tokens, the first at position pos0).
struct MlaAttnRange {
  int first = 0, rows = 0;
  bool expanded = false;
  int pos0 = 0;
  MlaDecodePlan plan;
};

// How the rows of pass `b` attend under `mode` where the expanded form runs
// at the model's widths (`expanded_ok`): a decode pass, kAbsorbed, or no
// expanded sequence give one absorbed range over every row; else each
// sequence (segment) of kMlaExpandedMinTokens new tokens or more (every one
// under kExpanded) is an expanded range, and consecutive other segments
// merge into absorbed ranges. Ranges cover [0, b.num_tokens) in order.
// Plans are left default.
std::vector<MlaAttnRange> MlaAttnRanges(const StepBatch& b, MlaPrefill mode, bool expanded_ok);

class MlaLayerStack : public LayerStack {
 public:
  MlaLayerStack(const ForwardContext& ctx, FfnBlock* ffn) : ctx_(ctx), ffn_(ffn) {}

  absl::Status Enqueue(const StepBatch& b, ExpertClient* experts) override;
  absl::Status EnqueueFinalNorm(int num_tokens, int num_rows, const int32_t* rows,
                                bf16* out) override;

 private:
  // q_a_layernorm and kv_a_layernorm are built without the config's eps
  // (common/model/attention_model.cc); transformers' DeepseekV32Indexer
  // builds its key LayerNorm with 1e-6 too.
  static constexpr float kLatentNormEps = 1e-6f;
  static constexpr float kIndexerKeyNormEps = 1e-6f;

  absl::Status Init() override;
  // V3.2 (mla_layer_stack_dsa.cc): the indexer's scratch; its keys into the
  // cache rows, queries and the top-k per token of layer `layer`; the tuned
  // MLA kernel over each token's gathered selection (`mp` as for the dense
  // kernel: q, out, softmax scale, the layer's pool).
  absl::Status InitIndexer();
  absl::Status EnqueueIndexer(int layer, int num_tokens);
  absl::Status EnqueueSparseMla(const StepBatch& b, const MlaDecodeParams& mp);

  using AttnRange = MlaAttnRange;
  // The pass's ranges into ranges_ (MlaAttnRanges), each absorbed range's
  // split plan, their workspace allocated. After plan_ is the pass's.
  absl::Status PlanAttention(const StepBatch& b);
  // The decode kernel over range r's rows of `whole` (the pass's params).
  absl::Status EnqueueAbsorbedAttention(const StepBatch& b, const AttnRange& r,
                                        const MlaDecodeParams& whole);
  // mla_layer_stack_prefill.cc: whether the expanded form runs at these
  // widths, and its scratch; range r's attention output into attn_ (q: the
  // pass's queries, q_ld apart; their roped part in q_mla_).
  absl::Status InitExpandedPrefill();
  absl::Status EnqueueExpandedAttention(int layer, const AttnRange& r, const bf16* q, int q_ld);

  const ForwardContext& ctx_;
  FfnBlock* const ffn_;
  // The pool's rows (CudaModelOptions::fp8_kv_cache), known before it exists.
  KvCacheDtype kv_dtype() const {
    return ctx_.options.fp8_kv_cache ? KvCacheDtype::kFp8 : KvCacheDtype::kBf16;
  }
  // Where a row's indexer key starts, in the pool's 2-byte units: after
  // latent + rope (bf16 rows), or after the FP8 row's rope part (its bf16
  // part is rope + index key: CudaModel::kv_row_spec).
  int IndexKeyOffset() const;
  bool fast_mla_ = false;  // the tuned MLA kernel on the cache
  float softmax_scale_ = 1.0f;
  RopeTableView rope_;
  DeviceBuffer<float> inv_freq_;
  MlaDecodePlan plan_;                            // the current pass's
  DeviceBuffer<uint8_t> decode_ws_, prefill_ws_;  // MLA split partials (decode_ws_ fixed: graphs)
  // Activations, [max_tokens, ...].
  DeviceBuffer<float> x_, normed_f32_;
  DeviceBuffer<bf16> normed_, qkv_, qa_, q_, q_mla_, o_lat_, attn_;
  // V3.2: the indexer, its table (the model's, rotate-half layout), and at
  // the tuned kernel's widths each token's selected rows (their pool rows
  // in sparse_rows_) gathered into sparse_.
  IndexerScratch index_;
  RopeTableView index_rope_;
  bool sparse_fast_ = false;
  // A kernel reads each token's selection out of the pool
  // (!sparse_mla_gather): the 16-head kernel over bf16 rows, the 64-head
  // kernel over FP8 rows (from 64 heads up; sparse_tile_ says which); else
  // the selected rows are gathered (an FP8 pool's widened exactly) into
  // sparse_.
  bool sparse_direct_ = false;
  MlaTileConfig sparse_tile_ = mla::kDefaultTile;
  MlaScratch sparse_;
  DeviceBuffer<int32_t> sparse_rows_;
  // sparse_direct_: the kernel's split partials for decode
  // passes (fixed: graphs), planned at SparseDecodeRows() for every bucket:
  // the most rows a token selects (index_topk, or fewer when max_model_len is).
  DeviceBuffer<uint8_t> sparse_ws_;
  int SparseDecodeRows() const { return std::min(ctx_.config.indexer.topk, ctx_.max_model_len); }
  // The expanded prefill: the pass's attention ranges; context rows expanded
  // at a time; their latent rows [chunk_rows_, latent + rope], K's no-rope
  // part and V [chunk_rows_, heads, 128]; the log2-sum-exp of the ranges
  // merged so far, [max_tokens, heads].
  std::vector<AttnRange> ranges_;
  bool expanded_ok_ = false;
  int chunk_rows_ = 0;
  DeviceBuffer<bf16> latent_rows_, k_exp_, v_exp_;
  DeviceBuffer<float> prefill_lse_;
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_MLA_MLA_LAYER_STACK_H_
