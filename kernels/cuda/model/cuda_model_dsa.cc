// DeepSeek-V3.2's lightning indexer on the CUDA model (the CPU reference:
// common/model/attention_model.cc IndexerProject and kernels/cpu/dsa_indexer.h).
// Per layer, after the latent rows are written: the indexer key (qkv_a's
// wk rows, LayerNorm, RoPE on its first rope dims in the rotate-half layout)
// into the tail of each cache row; the queries (q latent · wq_b, roped the
// same way); then each token's top index_topk causal rows, which the MLA
// attention reads through its row index.
#include <cmath>

#include "kernels/cuda/model/cuda_model.h"
#include "kernels/cuda/model/dsa_ops.h"
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

}  // namespace moesh::cuda
