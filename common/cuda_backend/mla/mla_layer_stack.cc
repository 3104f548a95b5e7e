#include "common/cuda_backend/mla/mla_layer_stack.h"

#include <algorithm>

#include "base/status.h"
#include "common/model/attention_model.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/ops.h"

namespace moesh::cuda {

absl::Status MlaLayerStack::Init() {
  const ModelConfig& c = ctx_.config;
  if (c.has_indexer() && c.q_lora_rank <= 0) {
    return absl::InvalidArgumentError("CudaModel: DeepSeek-V3.2's indexer needs q_lora_rank > 0");
  }
  const size_t t = ctx_.max_tokens;
  const int h = c.hidden_size, heads = c.num_attention_heads, qk = c.qk_head_dim();
  const int rank = c.kv_lora_rank, rope = c.qk_rope_head_dim, v = c.v_head_dim;
  const bool tuned_widths = rank == mla::kLatentDim && rope == mla::kRopeDim &&
                            ctx_.options.mla_kernel != MlaKernel::kGeneric;
  // V3.2 attends to the indexer's selection: the generic kernel, which reads a row index.
  fast_mla_ = tuned_widths && !c.has_indexer();
  softmax_scale_ = static_cast<float>(c.SoftmaxScale());
  const cpu::RopeTable table = MakeRopeTable(c);
  RETURN_IF_ERROR(inv_freq_.Reallocate(table.inv_freq.size()));
  RETURN_IF_ERROR(inv_freq_.CopyFrom(table.inv_freq));
  rope_.inv_freq = inv_freq_.get();
  rope_.attention_factor = table.attention_factor;
  rope_.dim = rope;
  rope_.layout = c.rope_interleave ? RopeLayout::kInterleaved : RopeLayout::kHalves;

  RETURN_IF_ERROR(x_.Reallocate(t * h));
  RETURN_IF_ERROR(normed_.Reallocate(t * h));
  RETURN_IF_ERROR(normed_f32_.Reallocate(t * h));
  RETURN_IF_ERROR(qkv_.Reallocate(t * ctx_.weights->qkv_width()));
  RETURN_IF_ERROR(qa_.Reallocate(t * std::max(c.q_lora_rank, 1)));
  RETURN_IF_ERROR(q_.Reallocate(c.q_lora_rank > 0 ? t * heads * qk : 1));
  RETURN_IF_ERROR(q_mla_.Reallocate(t * heads * (rank + rope)));
  RETURN_IF_ERROR(o_lat_.Reallocate(t * heads * rank));
  RETURN_IF_ERROR(attn_.Reallocate(t * heads * v));
  if (c.has_indexer()) {
    RETURN_IF_ERROR(InitIndexer());
  }
  if (fast_mla_) {
    size_t ws = 0;
    for (int b : ctx_.buckets) {
      ws = std::max(ws, PlanMlaDecode(b, heads, ctx_.max_model_len, ctx_.info.num_sms,
                                      MlaTile(ctx_.options.mla_kernel), kv_dtype())
                            .workspace_bytes);
    }
    RETURN_IF_ERROR(decode_ws_.Reallocate(ws));
  }
  return InitExpandedPrefill();
}

std::vector<MlaAttnRange> MlaAttnRanges(const StepBatch& b, MlaPrefill mode, bool expanded_ok) {
  std::vector<MlaAttnRange> ranges;
  MlaAttnRange whole;
  whole.rows = b.num_tokens;
  if (!expanded_ok || b.decode || mode == MlaPrefill::kAbsorbed) return {whole};
  int first = 0;
  for (size_t s = 0; s < b.seg_last.size(); ++s) {
    MlaAttnRange r;
    r.first = first, r.rows = b.seg_last[s] + 1 - first, r.pos0 = b.seg_from[s];
    r.expanded = mode == MlaPrefill::kExpanded || r.rows >= kMlaExpandedMinTokens;
    first += r.rows;
    if (!r.expanded && !ranges.empty() && !ranges.back().expanded) {
      ranges.back().rows += r.rows;  // absorbed rows of several sequences: one launch
    } else {
      ranges.push_back(r);
    }
  }
  if (ranges.size() == 1 && !ranges[0].expanded) return {whole};
  return ranges;
}

absl::Status MlaLayerStack::PlanAttention(const StepBatch& b) {
  ranges_ = MlaAttnRanges(b, ctx_.options.mla_prefill, expanded_ok_);
  if (ranges_.size() == 1 && !ranges_[0].expanded) {
    ranges_[0].plan = plan_;
    return absl::OkStatus();
  }
  size_t ws = 0;
  for (AttnRange& r : ranges_) {
    if (r.expanded || !fast_mla_) continue;
    r.plan = PlanMlaDecode(r.rows, ctx_.config.num_attention_heads, b.max_seq_len,
                           ctx_.info.num_sms, MlaTile(ctx_.options.mla_kernel), kv_dtype());
    ws = std::max(ws, r.plan.workspace_bytes);
  }
  if (ws > prefill_ws_.bytes()) {
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(ctx_.stream));  // the old buffer may be in use
    RETURN_IF_ERROR(prefill_ws_.Reallocate(ws));
  }
  return absl::OkStatus();
}

absl::Status MlaLayerStack::EnqueueAbsorbedAttention(const StepBatch& b, const AttnRange& r,
                                                     const MlaDecodeParams& whole) {
  const ModelConfig& c = ctx_.config;
  const int heads = c.num_attention_heads, rank = c.kv_lora_rank;
  MlaDecodeParams mp = whole;
  if (r.first != 0 || r.rows != b.num_tokens) {
    // A selection (V3.2) always attends as one range (MlaAttnRanges: no
    // expanded form with an indexer); its kv_index would need offsetting too.
    if (mp.kv_index != nullptr) {
      return absl::InternalError("MlaLayerStack: a sparse selection split into ranges");
    }
    mp.q += static_cast<size_t>(r.first) * heads * (rank + c.qk_rope_head_dim);
    mp.seq_lens += r.first;
    mp.block_table += static_cast<size_t>(r.first) * ctx_.max_blocks_per_seq();
    mp.out = o_lat_.get() + static_cast<size_t>(r.first) * heads * rank;
    mp.batch = r.rows;
  }
  if (!fast_mla_) return RunMlaAttentionGeneric(mp);
  mp.num_splits = r.plan.num_splits, mp.tile = MlaTile(ctx_.options.mla_kernel);
  mp.workspace = b.decode ? decode_ws_.get() : prefill_ws_.get();
  mp.workspace_bytes = b.decode ? decode_ws_.bytes() : prefill_ws_.bytes();
  return RunMlaDecode(mp);
}

absl::Status MlaLayerStack::Enqueue(const StepBatch& b, ExpertClient* experts) {
  const ModelConfig& c = ctx_.config;
  const StepInputs& in = *ctx_.in;
  KvPool& kv = ctx_.kv();
  cudaStream_t s = ctx_.stream;
  if (fast_mla_) {
    plan_ = PlanMlaDecode(b.num_tokens, c.num_attention_heads, b.max_seq_len, ctx_.info.num_sms,
                          MlaTile(ctx_.options.mla_kernel), kv_dtype());
    if (!b.decode && plan_.workspace_bytes > prefill_ws_.bytes()) {
      // The old buffer may still be in use.
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s));
      RETURN_IF_ERROR(prefill_ws_.Reallocate(plan_.workspace_bytes));
    }
  }
  RETURN_IF_ERROR(PlanAttention(b));
  const int t = b.num_tokens;
  const int h = c.hidden_size, heads = c.num_attention_heads, qk = c.qk_head_dim();
  const int rank = c.kv_lora_rank, rope = c.qk_rope_head_dim, nope = c.qk_nope_head_dim,
            v = c.v_head_dim;
  const int qkv_w = ctx_.weights->qkv_width(), row_w = rank + rope;
  const float eps = static_cast<float>(c.rms_norm_eps);

  EmbedParams ep;
  ep.table = ctx_.weights->embed(), ep.token_ids = in.tokens, ep.num_tokens = t, ep.hidden = h;
  ep.out = x_.get(), ep.stream = s;
  RETURN_IF_ERROR(RunEmbed(ep));
  RETURN_IF_ERROR(ctx_.Mark(1));
  ffn_->BeginPass(t, b.real_tokens >= 0 ? b.real_tokens : t);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const DeviceLayerWeights& w = ctx_.weights->layer(l);
    RmsNormF32Params np;
    np.x = x_.get(), np.weight = w.input_norm, np.num_rows = t, np.n = h, np.eps = eps;
    np.y = normed_.get(), np.stream = s;
    RETURN_IF_ERROR(RunRmsNormF32(np));
    RETURN_IF_ERROR(ctx_.Gemm(normed_.get(), h, w.qkv_a, qkv_.get(), qkv_w, t, qkv_w, h,
                              OutType::kBf16, false));
    const bf16* q = qkv_.get();
    int q_ld = qkv_w;
    if (c.q_lora_rank > 0) {
      RmsNormParams qn;
      qn.x = qkv_.get(), qn.weight = w.q_a_norm, qn.y = qa_.get();
      qn.rows = t, qn.n = c.q_lora_rank, qn.ldx = qkv_w, qn.ldy = c.q_lora_rank,
      qn.eps = kLatentNormEps;
      qn.stream = s;
      RETURN_IF_ERROR(RunRmsNorm(qn));
      RETURN_IF_ERROR(ctx_.Gemm(qa_.get(), c.q_lora_rank, w.q_b, q_.get(), heads * qk, t,
                                heads * qk, c.q_lora_rank, OutType::kBf16, false));
      q = q_.get();
      q_ld = heads * qk;
    }
    // q_lat[t, h] = q_nope[t, h] · W_UK[h]: W_UK absorbed into the query
    // (the rows the absorbed kernel attends for).
    for (const AttnRange& r : ranges_) {
      if (r.expanded) continue;
      BatchedGemmParams ab;
      ab.x = q + static_cast<size_t>(r.first) * q_ld, ab.ldx = q_ld, ab.stride_x = qk;
      ab.w = w.w_uk_t, ab.ldw = nope, ab.stride_w = static_cast<int64_t>(rank) * nope;
      ab.y = q_mla_.get() + static_cast<size_t>(r.first) * heads * row_w, ab.ldy = heads * row_w,
      ab.stride_y = row_w;
      ab.batch = heads, ab.m = r.rows, ab.n = rank, ab.k = nope, ab.out_type = OutType::kBf16,
      ab.stream = s;
      RETURN_IF_ERROR(ctx_.Batched(ab));
    }
    // q_mla's rope part: q's, roped on the way (the cache write's kernel).
    RopeKvCacheParams kp;
    kp.kv = qkv_.get() + ctx_.weights->kv_col(), kp.kv_ld = qkv_w, kp.kv_norm_weight = w.kv_a_norm,
    kp.eps = kLatentNormEps;
    kp.cache = kv.layer(l), kp.cache_row_stride = kv.row_stride(), kp.num_blocks = kv.num_blocks();
    kp.cache_dtype = kv.row().dtype;
    kp.slot_mapping = in.slots;
    kp.num_tokens = t, kp.kv_lora_rank = rank;
    kp.q = q_mla_.get(), kp.q_num_heads = heads, kp.q_token_stride = heads * row_w,
    kp.q_head_stride = row_w;
    kp.q_rope_offset = rank;
    kp.q_src = q, kp.q_src_token_stride = q_ld, kp.q_src_head_stride = qk, kp.q_src_offset = nope;
    kp.positions = in.positions, kp.rope = rope_, kp.stream = s;
    RETURN_IF_ERROR(RunRopeKvCacheWrite(kp));
    if (c.has_indexer()) RETURN_IF_ERROR(EnqueueIndexer(l, t));
    MlaDecodeParams mp;
    mp.q = q_mla_.get(), mp.kv_cache = kv.layer(l), mp.block_table = in.block_table;
    mp.seq_lens = in.seq_lens, mp.batch = t, mp.num_heads = heads, mp.kv_lora_rank = rank,
    mp.rope_dim = rope;
    mp.num_blocks = kv.num_blocks(), mp.max_blocks_per_seq = in.max_blocks_per_seq,
    mp.max_seq_len = b.max_seq_len;
    mp.softmax_scale = softmax_scale_, mp.out = o_lat_.get(), mp.out_type = OutType::kBf16,
    mp.stream = s;
    mp.kv_row_stride = kv.row_stride(), mp.kv_dtype = kv.row().dtype;
    if (c.has_indexer()) {  // the indexer's selection (all causal rows up to index_topk of them)
      mp.seq_lens = index_.count.get(), mp.kv_index = index_.selected.get(),
      mp.kv_index_stride = c.indexer.topk;
    }
    if (sparse_fast_) {
      RETURN_IF_ERROR(EnqueueSparseMla(b, mp));
    } else {
      for (const AttnRange& r : ranges_) {
        RETURN_IF_ERROR(r.expanded ? EnqueueExpandedAttention(l, r, q, q_ld)
                                   : EnqueueAbsorbedAttention(b, r, mp));
      }
    }
    // attn[t, h] = o_lat[t, h] · W_UV[h]^T (the expanded rows' attn is
    // already there), then x += attn · o_proj^T.
    for (const AttnRange& r : ranges_) {
      if (r.expanded) continue;
      BatchedGemmParams vb;
      vb.x = o_lat_.get() + static_cast<size_t>(r.first) * heads * rank, vb.ldx = heads * rank,
      vb.stride_x = rank;
      vb.w = w.w_uv, vb.ldw = rank, vb.stride_w = static_cast<int64_t>(v) * rank;
      vb.y = attn_.get() + static_cast<size_t>(r.first) * heads * v, vb.ldy = heads * v,
      vb.stride_y = v;
      vb.batch = heads, vb.m = r.rows, vb.n = v, vb.k = rank, vb.out_type = OutType::kBf16,
      vb.stream = s;
      RETURN_IF_ERROR(ctx_.Batched(vb));
    }
    RETURN_IF_ERROR(ctx_.Gemm(attn_.get(), heads * v, w.o_proj, x_.get(), h, t, h, heads * v,
                              OutType::kFloat32, true));
    RETURN_IF_ERROR(ctx_.Mark(2 + 2 * l));

    np.weight = w.post_norm;
    np.y_f32 = w.is_moe ? normed_f32_.get() : nullptr;
    RETURN_IF_ERROR(RunRmsNormF32(np));
    if (w.is_moe) {
      RETURN_IF_ERROR(ffn_->EnqueueMoe(l, t, normed_.get(), normed_f32_.get(), x_.get(), experts));
    } else {
      RETURN_IF_ERROR(ffn_->EnqueueMlp(w.dense_gate_up, w.dense_down, c.intermediate_size, t,
                                       normed_.get(), x_.get()));
    }
    RETURN_IF_ERROR(ctx_.Mark(3 + 2 * l));
  }
  return absl::OkStatus();
}

absl::Status MlaLayerStack::EnqueueFinalNorm(int num_tokens, int num_rows, const int32_t* rows,
                                             bf16* out) {
  const ModelConfig& c = ctx_.config;
  RmsNormF32Params np;
  np.x = x_.get(), np.rows = rows, np.weight = ctx_.weights->norm(), np.num_rows = num_rows;
  np.n = c.hidden_size, np.eps = static_cast<float>(c.rms_norm_eps), np.y = out;
  np.stream = ctx_.stream;
  return RunRmsNormF32(np);
}

}  // namespace moesh::cuda
