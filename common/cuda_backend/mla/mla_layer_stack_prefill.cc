// The expanded MLA prefill in MlaLayerStack (CudaModelOptions::mla_prefill):
// for a sequence's new tokens, per layer and per range of at most
// chunk_rows_ context rows,
//   latent rows [k0, k1) of the sequence (RunGatherKvRows: FP8 rows widened)
//   → V = rows · W_UV^T for every head at once, K_nope[h] = rows · W_UK[h]^T
//     (cuBLASLt, the latent shared by the heads)
//   → RunMlaPrefill: the tokens' queries (no-rope part from q, the roped part
//     from q_mla_) against those keys, merged into the earlier ranges'
//     result by log2-sum-exp,
// which leaves the sequence's attention output [tokens, heads, 128] in attn_.
#include <algorithm>

#include "base/status.h"
#include "common/cuda_backend/mla/mla_layer_stack.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/mla_prefill.h"
#include "kernels/cuda/model_ops.h"

namespace moesh::cuda {

absl::Status MlaLayerStack::InitExpandedPrefill() {
  const ModelConfig& c = ctx_.config;
  expanded_ok_ = fast_mla_ && ctx_.options.mla_prefill != MlaPrefill::kAbsorbed &&
                 c.qk_nope_head_dim == mla_prefill::kNopeDim &&
                 c.qk_rope_head_dim == mla_prefill::kRopeDim && c.v_head_dim == mla_prefill::kVDim;
  if (!expanded_ok_) return absl::OkStatus();
  const int heads = c.num_attention_heads, row_w = c.kv_lora_rank + c.qk_rope_head_dim;
  const int max_rows = (ctx_.max_model_len + kKvBlockSize - 1) / kKvBlockSize * kKvBlockSize;
  if (ctx_.options.mla_prefill_chunk_rows > 0) {
    chunk_rows_ = std::min(ctx_.options.mla_prefill_chunk_rows, max_rows);
  } else {
    constexpr size_t kBudgetBytes = size_t{256} << 20;
    const size_t row_bytes =
        sizeof(bf16) *
        (static_cast<size_t>(heads) * (mla_prefill::kNopeDim + mla_prefill::kVDim) + row_w);
    const int fit = static_cast<int>(kBudgetBytes / row_bytes) / kKvBlockSize * kKvBlockSize;
    chunk_rows_ = std::min(max_rows, std::max(kKvBlockSize, fit));
  }
  const size_t rows = static_cast<size_t>(chunk_rows_);
  RETURN_IF_ERROR(latent_rows_.Reallocate(rows * row_w));
  RETURN_IF_ERROR(k_exp_.Reallocate(rows * heads * mla_prefill::kNopeDim));
  RETURN_IF_ERROR(v_exp_.Reallocate(rows * heads * mla_prefill::kVDim));
  return prefill_lse_.Reallocate(static_cast<size_t>(ctx_.max_tokens) * heads);
}

absl::Status MlaLayerStack::EnqueueExpandedAttention(int layer, const AttnRange& r, const bf16* q,
                                                     int q_ld) {
  const ModelConfig& c = ctx_.config;
  const DeviceLayerWeights& w = ctx_.weights->layer(layer);
  KvPool& kv = ctx_.kv();
  cudaStream_t s = ctx_.stream;
  const int heads = c.num_attention_heads, rank = c.kv_lora_rank, rope = c.qk_rope_head_dim;
  const int row_w = rank + rope, nope = mla_prefill::kNopeDim, v = mla_prefill::kVDim;
  const int len = r.pos0 + r.rows;  // the context: every row up to the last new token's
  for (int k0 = 0; k0 < len; k0 += chunk_rows_) {
    const int n = std::min(chunk_rows_, len - k0);
    GatherKvRowsParams g;
    g.cache = kv.layer(layer), g.dtype = kv.row().dtype, g.row_stride = kv.row_stride();
    g.latent = rank, g.rope = rope;
    g.block_table = ctx_.in->block_table + static_cast<size_t>(r.first) * ctx_.max_blocks_per_seq();
    g.num_blocks = kv.num_blocks(), g.from = k0, g.count = n;
    g.out = latent_rows_.get(), g.ldo = row_w, g.stream = s;
    RETURN_IF_ERROR(RunGatherKvRows(g));
    // V[j, h] = latent[j] · W_UV[h]^T: w_uv is [heads · v, rank], one GEMM.
    GemmParams vg;
    vg.x = latent_rows_.get(), vg.ldx = row_w, vg.w = w.w_uv, vg.y = v_exp_.get();
    vg.m = n, vg.n = heads * v, vg.k = rank, vg.out_type = OutType::kBf16, vg.stream = s;
    RETURN_IF_ERROR(ctx_.gemm->Run(vg));
    // K_nope[j, h] = latent[j] · W_UK[h]^T, W_UK[h]^T stored [rank, nope] (w_uk_t).
    BatchedGemmParams kg;
    kg.x = latent_rows_.get(), kg.ldx = row_w, kg.stride_x = 0;
    kg.w = w.w_uk_t, kg.ldw = nope, kg.stride_w = static_cast<int64_t>(rank) * nope, kg.w_kn = true;
    kg.y = k_exp_.get(), kg.ldy = heads * nope, kg.stride_y = nope;
    kg.batch = heads, kg.m = n, kg.n = nope, kg.k = rank, kg.out_type = OutType::kBf16;
    kg.stream = s;
    RETURN_IF_ERROR(ctx_.gemm->RunBatched(kg));

    MlaPrefillParams pp;
    pp.q_nope = q + static_cast<size_t>(r.first) * q_ld, pp.q_nope_ld = q_ld;
    pp.q_nope_head_stride = c.qk_head_dim();
    pp.q_pe = q_mla_.get() + static_cast<size_t>(r.first) * heads * row_w + rank;
    pp.q_pe_ld = static_cast<int64_t>(heads) * row_w, pp.q_pe_head_stride = row_w;
    pp.k_nope = k_exp_.get(), pp.v = v_exp_.get(), pp.kv_ld = static_cast<int64_t>(heads) * nope;
    pp.kv_head_stride = nope;
    pp.k_pe = latent_rows_.get() + rank, pp.k_pe_ld = row_w;
    pp.num_q = r.rows, pp.num_k = n, pp.num_heads = heads, pp.q_pos0 = r.pos0, pp.k_pos0 = k0;
    pp.softmax_scale = softmax_scale_;
    pp.out = attn_.get() + static_cast<size_t>(r.first) * heads * v;
    pp.out_ld = static_cast<int64_t>(heads) * v, pp.out_head_stride = v;
    pp.lse = prefill_lse_.get() + static_cast<size_t>(r.first) * heads, pp.merge = k0 > 0;
    pp.impl = ctx_.options.mla_prefill_impl;
    pp.stream = s;
    RETURN_IF_ERROR(RunMlaPrefill(pp));
  }
  return absl::OkStatus();
}

}  // namespace moesh::cuda
