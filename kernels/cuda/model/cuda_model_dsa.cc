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

#include "kernels/cuda/model/cuda_model.h"
#include "kernels/cuda/model/dsa_ops.h"
#include "kernels/cuda/model/model_ops.h"
#include "kernels/cuda/ops.h"

namespace moesh::cuda {
namespace {

// transformers' DeepseekV32Indexer builds its key LayerNorm with this eps.
constexpr float kIndexerKeyNormEps = 1e-6f;

}  // namespace

absl::Status CudaModel::EnqueueDsaIndexer(int layer, int num_tokens) {
  const ModelConfig& c = config_;
  const DeviceLayerWeights& w = weights_->layer(layer);
  cudaStream_t s = stream_.get();
  const int ni = c.index_n_heads, di = c.index_head_dim, qkv_w = weights_->qkv_width();
  const int key_col = weights_->q_width() + c.kv_lora_rank + c.qk_rope_head_dim;  // in qkv_ and in the cache row
  IndexKeyParams kp;
  kp.src = qkv_.get() + key_col, kp.ld_src = qkv_w, kp.num_tokens = num_tokens, kp.dim = di;
  kp.weight = w.index_k_norm, kp.bias = w.index_k_bias, kp.eps = kIndexerKeyNormEps;
  kp.positions = d_positions_.get(), kp.slot_mapping = d_slots_.get();
  kp.cache = kv_->layer(layer), kp.row_width = kv_->row_width(), kp.offset = c.kv_lora_rank + c.qk_rope_head_dim;
  kp.rope = index_rope_, kp.stream = s;
  RETURN_IF_ERROR(RunIndexKey(kp));
  RETURN_IF_ERROR(Gemm(qa_.get(), c.q_lora_rank, w.index_wq_b, index_q_.get(), ni * di, num_tokens, ni * di,
                       c.q_lora_rank, OutType::kBf16, false));
  RopeParams rp;
  rp.x = index_q_.get(), rp.num_tokens = num_tokens, rp.num_rows = ni;
  rp.token_stride = ni * di, rp.row_stride = di, rp.offset = 0;
  rp.positions = d_positions_.get(), rp.rope = index_rope_, rp.stream = s;
  RETURN_IF_ERROR(RunRope(rp));
  IndexerParams xp;
  xp.q = index_q_.get(), xp.w = qkv_.get() + key_col + di, xp.ldw = qkv_w;
  xp.w_scale = 1.0f / std::sqrt(static_cast<float>(ni)), xp.scale = 1.0f / std::sqrt(static_cast<float>(di));
  xp.num_tokens = num_tokens, xp.num_heads = ni, xp.head_dim = di, xp.rate = 1, xp.top_k = c.index_topk;
  xp.seq_lens = d_seq_lens_.get();
  xp.key_cache = kv_->layer(layer), xp.key_row_width = kv_->row_width();
  xp.key_offset = c.kv_lora_rank + c.qk_rope_head_dim;
  xp.block_table = d_block_table_.get(), xp.max_blocks_per_seq = max_blocks_per_seq_;
  xp.scores = index_scores_.get(), xp.max_keys = index_max_keys_;
  xp.selected = index_selected_.get(), xp.count = index_count_.get(), xp.stream = s;
  return RunIndexer(xp);
}

absl::Status CudaModel::InitSparseMla() {
  const ModelConfig& c = config_;
  sparse_pad_ = (c.index_topk + kKvBlockSize - 1) / kKvBlockSize * kKvBlockSize;
  sparse_tokens_ = std::min(max_tokens_, std::max(max_rows_, 256));
  const int per_token = sparse_pad_ / kKvBlockSize;
  const size_t row = c.kv_lora_rank + c.qk_rope_head_dim;
  RETURN_IF_ERROR(sparse_kv_.Reallocate(static_cast<size_t>(sparse_tokens_) * sparse_pad_ * row));
  std::vector<int32_t> table(static_cast<size_t>(sparse_tokens_) * per_token);
  std::iota(table.begin(), table.end(), 0);
  RETURN_IF_ERROR(sparse_table_.Reallocate(table.size()));
  RETURN_IF_ERROR(sparse_table_.CopyFrom(table));
  RETURN_IF_ERROR(sparse_rows_.Reallocate(static_cast<size_t>(max_tokens_) * sparse_pad_));
  size_t ws = 0;
  for (int n = 1; n <= sparse_tokens_; ++n) {
    ws = std::max(ws, PlanMlaDecode(n, c.num_attention_heads, sparse_pad_, info_.num_sms).workspace_bytes);
  }
  return sparse_ws_.Reallocate(ws);
}

absl::Status CudaModel::EnqueueSparseMla(const Batch& b, const MlaDecodeParams& mp) {
  const ModelConfig& c = config_;
  cudaStream_t s = stream_.get();
  const int t = b.num_tokens, heads = c.num_attention_heads, rank = c.kv_lora_rank;
  const int row = rank + c.qk_rope_head_dim, per_token = sparse_pad_ / kKvBlockSize;
  SelectedRowsParams sr;
  sr.selected = index_selected_.get(), sr.count = index_count_.get(), sr.num_tokens = t, sr.top_k = c.index_topk;
  sr.stride = sparse_pad_, sr.block_table = d_block_table_.get(), sr.max_blocks_per_seq = max_blocks_per_seq_;
  sr.rows = sparse_rows_.get(), sr.stream = s;
  RETURN_IF_ERROR(RunSelectedRows(sr));
  for (int first = 0; first < t; first += sparse_tokens_) {
    const int n = std::min(sparse_tokens_, t - first);
    GatherRowsParams g;
    g.x = mp.kv_cache, g.ldx = kv_->row_width(), g.index = sparse_rows_.get() + static_cast<size_t>(first) * sparse_pad_;
    g.rows = n * sparse_pad_, g.cols = row, g.out = sparse_kv_.get(), g.stream = s;
    RETURN_IF_ERROR(RunGatherRows(g));
    MlaDecodeParams sp = mp;
    const MlaDecodePlan plan = PlanMlaDecode(n, heads, sparse_pad_, info_.num_sms);
    sp.q = mp.q + static_cast<size_t>(first) * heads * row;
    sp.kv_cache = sparse_kv_.get(), sp.block_table = sparse_table_.get(), sp.seq_lens = index_count_.get() + first;
    sp.batch = n, sp.num_blocks = sparse_tokens_ * per_token, sp.max_blocks_per_seq = per_token;
    sp.max_seq_len = sparse_pad_, sp.kv_row_stride = 0, sp.kv_index = nullptr, sp.kv_index_stride = 0;
    sp.out = static_cast<bf16*>(mp.out) + static_cast<size_t>(first) * heads * rank;
    sp.num_splits = plan.num_splits, sp.workspace = sparse_ws_.get(), sp.workspace_bytes = sparse_ws_.bytes();
    RETURN_IF_ERROR(RunMlaDecode(sp));
  }
  return absl::OkStatus();
}

}  // namespace moesh::cuda
