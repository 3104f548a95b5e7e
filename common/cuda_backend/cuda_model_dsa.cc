// DeepSeek-V3.2's lightning indexer on the CUDA model (the CPU reference:
// common/model/attention_model.cc IndexerProject and kernels/cpu/dsa_indexer.h).
// Per layer, after the latent rows are written: the indexer key (qkv_a's
// wk rows, LayerNorm, RoPE on its first rope dims in the rotate-half layout)
// into the tail of each cache row; the queries (q latent · wq_b, roped the
// same way); then each token's top index_topk causal rows, which the MLA
// attention reads through its row index (the plain kernel), or, at the
// tuned kernel's widths, from a dense copy of the selected rows.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/cuda_backend/cuda_model.h"
#include "kernels/cuda/dsa_ops.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/ops.h"

namespace moesh::cuda {
namespace {

// transformers' DeepseekV32Indexer builds its key LayerNorm with this eps.
constexpr float kIndexerKeyNormEps = 1e-6f;

}  // namespace

absl::Status CudaModel::InitIndexer(int max_keys) {
  const ModelConfig& c = config_;
  const size_t t = max_tokens_;
  index_max_keys_ = max_keys;
  RETURN_IF_ERROR(index_q_.Reallocate(t * c.index_n_heads * c.index_head_dim));
  RETURN_IF_ERROR(index_scores_.Reallocate(t * index_max_keys_));
  RETURN_IF_ERROR(index_selected_.Reallocate(t * c.index_topk));
  return index_count_.Reallocate(t);
}

absl::Status CudaModel::EnqueueDsaIndexer(int layer, int num_tokens) {
  const ModelConfig& c = config_;
  const DeviceLayerWeights& w = weights_->layer(layer);
  cudaStream_t s = stream_.get();
  const int ni = c.index_n_heads, di = c.index_head_dim, qkv_w = weights_->qkv_width();
  const int key_col =
      weights_->q_width() + c.kv_lora_rank + c.qk_rope_head_dim;  // in qkv_ and in the cache row
  IndexKeyParams kp;
  kp.src = qkv_.get() + key_col, kp.ld_src = qkv_w, kp.num_tokens = num_tokens, kp.dim = di;
  kp.weight = w.index_k_norm, kp.bias = w.index_k_bias, kp.eps = kIndexerKeyNormEps;
  kp.positions = d_positions_.get(), kp.slot_mapping = d_slots_.get();
  kp.cache = kv_->layer(layer), kp.row_width = kv_->row_width(),
  kp.offset = c.kv_lora_rank + c.qk_rope_head_dim;
  kp.rope = index_rope_, kp.stream = s;
  RETURN_IF_ERROR(RunIndexKey(kp));
  RETURN_IF_ERROR(Gemm(qa_.get(), c.q_lora_rank, w.index_wq_b, index_q_.get(), ni * di, num_tokens,
                       ni * di, c.q_lora_rank, OutType::kBf16, false));
  RopeParams rp;
  rp.x = index_q_.get(), rp.num_tokens = num_tokens, rp.num_rows = ni;
  rp.token_stride = ni * di, rp.row_stride = di, rp.offset = 0;
  rp.positions = d_positions_.get(), rp.rope = index_rope_, rp.stream = s;
  RETURN_IF_ERROR(RunRope(rp));
  IndexerParams xp;
  xp.q = index_q_.get(), xp.w = qkv_.get() + key_col + di, xp.ldw = qkv_w;
  xp.w_scale = 1.0f / std::sqrt(static_cast<float>(ni)),
  xp.scale = 1.0f / std::sqrt(static_cast<float>(di));
  xp.num_tokens = num_tokens, xp.num_heads = ni, xp.head_dim = di, xp.rate = 1,
  xp.top_k = c.index_topk;
  xp.seq_lens = d_seq_lens_.get();
  xp.key_cache = kv_->layer(layer), xp.key_row_width = kv_->row_width();
  xp.key_offset = c.kv_lora_rank + c.qk_rope_head_dim;
  xp.block_table = d_block_table_.get(), xp.max_blocks_per_seq = max_blocks_per_seq_;
  xp.scores = index_scores_.get(), xp.max_keys = index_max_keys_;
  xp.selected = index_selected_.get(), xp.count = index_count_.get(), xp.stream = s;
  return RunIndexer(xp);
}

absl::Status CudaModel::InitMlaScratch(int rows_per_token, MlaScratch* s) {
  s->stride = (rows_per_token + kKvBlockSize - 1) / kKvBlockSize * kKvBlockSize;
  s->tokens = std::min(max_tokens_, std::max(max_rows_, 256));
  RETURN_IF_ERROR(s->rows.Reallocate(static_cast<size_t>(s->tokens) * s->stride *
                                     (mla::kLatentDim + mla::kRopeDim)));
  std::vector<int32_t> table(static_cast<size_t>(s->tokens) * s->stride / kKvBlockSize);
  std::iota(table.begin(), table.end(), 0);
  RETURN_IF_ERROR(s->table.Reallocate(table.size()));
  RETURN_IF_ERROR(s->table.CopyFrom(table));
  size_t ws = 0;
  for (int n = 1; n <= s->tokens; ++n) {
    ws = std::max(
        ws,
        PlanMlaDecode(n, config_.num_attention_heads, s->stride, info_.num_sms).workspace_bytes);
  }
  return s->ws.Reallocate(ws);
}

absl::Status CudaModel::RunMlaOnScratch(const MlaScratch& s, int n, MlaDecodeParams mp) {
  const int per_token = s.stride / kKvBlockSize;
  const MlaDecodePlan plan = PlanMlaDecode(n, mp.num_heads, s.stride, info_.num_sms);
  mp.kv_cache = s.rows.get(), mp.block_table = s.table.get(), mp.batch = n;
  mp.kv_lora_rank = mla::kLatentDim, mp.rope_dim = mla::kRopeDim;
  mp.num_blocks = s.tokens * per_token, mp.max_blocks_per_seq = per_token,
  mp.max_seq_len = s.stride;
  mp.kv_row_stride = 0, mp.kv_index = nullptr, mp.kv_index_stride = 0;
  mp.num_splits = plan.num_splits, mp.workspace = s.ws.get(), mp.workspace_bytes = s.ws.bytes();
  mp.stream = stream_.get();
  return RunMlaDecode(mp);
}

absl::Status CudaModel::InitSparseMla() {
  RETURN_IF_ERROR(InitMlaScratch(config_.index_topk, &sparse_));
  return sparse_rows_.Reallocate(static_cast<size_t>(max_tokens_) * sparse_.stride);
}

absl::Status CudaModel::EnqueueSparseMla(const Batch& b, const MlaDecodeParams& mp) {
  const ModelConfig& c = config_;
  cudaStream_t s = stream_.get();
  const int t = b.num_tokens, heads = c.num_attention_heads, rank = c.kv_lora_rank;
  const int row = rank + c.qk_rope_head_dim;
  SelectedRowsParams sr;
  sr.selected = index_selected_.get(), sr.count = index_count_.get(), sr.num_tokens = t,
  sr.top_k = c.index_topk;
  sr.stride = sparse_.stride, sr.block_table = d_block_table_.get(),
  sr.max_blocks_per_seq = max_blocks_per_seq_;
  sr.rows = sparse_rows_.get(), sr.stream = s;
  RETURN_IF_ERROR(RunSelectedRows(sr));
  for (int first = 0; first < t; first += sparse_.tokens) {
    const int n = std::min(sparse_.tokens, t - first);
    GatherRowsParams g;
    g.x = mp.kv_cache, g.ldx = kv_->row_width(),
    g.index = sparse_rows_.get() + static_cast<size_t>(first) * sparse_.stride;
    g.rows = n * sparse_.stride, g.cols = row, g.out = sparse_.rows.get(), g.stream = s;
    RETURN_IF_ERROR(RunGatherRows(g));
    MlaDecodeParams sp = mp;
    sp.q = mp.q + static_cast<size_t>(first) * heads * row,
    sp.seq_lens = index_count_.get() + first;
    sp.out = static_cast<bf16*>(mp.out) + static_cast<size_t>(first) * heads * rank;
    RETURN_IF_ERROR(RunMlaOnScratch(sparse_, n, sp));
  }
  return absl::OkStatus();
}

}  // namespace moesh::cuda
