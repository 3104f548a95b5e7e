// DeepSeek-V3.2's lightning indexer in MlaLayerStack (the CPU reference:
// common/model/attention_model.cc IndexerProject and kernels/cpu/dsa_indexer.h).
// Per layer, after the latent rows are written: the indexer key (qkv_a's
// wk rows, LayerNorm, RoPE on its first rope dims in the rotate-half layout)
// into the tail of each cache row; the queries (q latent · wq_b, roped the
// same way); then each token's top index_topk causal rows, which the MLA
// attention reads through its row index (the plain kernel, and the tuned
// 16-head kernel with CudaModelOptions::sparse_mla_gather off on bf16 rows,
// the 64-head kernel on FP8 rows from 64 heads up), or, at the tuned
// kernel's widths, from a dense bf16 copy of the selected rows (an FP8
// pool's widened exactly: the 16-head FP8 kernel reads no selection).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/status.h"
#include "common/cuda_backend/mla/mla_layer_stack.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/dsa_ops.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/ops.h"

namespace moesh::cuda {

absl::Status MlaLayerStack::InitIndexer() {
  const ModelConfig& c = ctx_.config;
  RETURN_IF_ERROR(index_.Init(ctx_, ctx_.max_model_len));  // every causal row is a key
  index_rope_ = rope_;
  index_rope_.layout = RopeLayout::kHalves;  // transformers' DeepseekV32Indexer rotates halves
  if (c.kv_lora_rank != mla::kLatentDim || c.qk_rope_head_dim != mla::kRopeDim ||
      ctx_.options.mla_kernel == MlaKernel::kGeneric) {
    return absl::OkStatus();
  }
  sparse_fast_ = true;
  const bool fp8 = kv_dtype() == KvCacheDtype::kFp8;
  sparse_direct_ =
      !ctx_.options.sparse_mla_gather && (!fp8 || c.num_attention_heads >= mla::kWideHeads);
  sparse_tile_ = fp8 ? MlaTileConfig::kHeads64Tokens64Stages2 : mla::kDefaultTile;
  if (sparse_direct_) {
    size_t ws = 0;
    for (int n : ctx_.buckets) {
      ws = std::max(ws, PlanMlaDecode(n, c.num_attention_heads, SparseDecodeRows(),
                                      ctx_.info.num_sms, sparse_tile_, kv_dtype())
                            .workspace_bytes);
    }
    return sparse_ws_.Reallocate(ws);
  }
  RETURN_IF_ERROR(sparse_.Init(ctx_, c.indexer.topk));
  return sparse_rows_.Reallocate(static_cast<size_t>(ctx_.max_tokens) * sparse_.stride);
}

int MlaLayerStack::IndexKeyOffset() const {
  const ModelConfig& c = ctx_.config;
  if (kv_dtype() == KvCacheDtype::kBf16) return c.kv_lora_rank + c.qk_rope_head_dim;
  const cpu::Fp8KvRowLayout row{c.kv_lora_rank, c.qk_rope_head_dim};
  return (row.rope_offset() + 2 * c.qk_rope_head_dim) / 2;  // rope_offset is even
}

absl::Status MlaLayerStack::EnqueueIndexer(int layer, int num_tokens) {
  const ModelConfig& c = ctx_.config;
  const DeviceLayerWeights& w = ctx_.weights->layer(layer);
  cudaStream_t s = ctx_.stream;
  const int ni = c.indexer.n_heads, di = c.indexer.head_dim, qkv_w = ctx_.weights->qkv_width();
  const int key_col = ctx_.weights->index_col();  // in qkv_
  IndexKeyParams kp;
  kp.src = qkv_.get() + key_col, kp.ld_src = qkv_w, kp.num_tokens = num_tokens, kp.dim = di;
  kp.weight = w.index_k_norm, kp.bias = w.index_k_bias, kp.eps = kIndexerKeyNormEps;
  kp.positions = ctx_.in->positions, kp.slot_mapping = ctx_.in->slots;
  kp.cache = ctx_.kv().layer(layer), kp.row_width = ctx_.kv().row_stride(),
  kp.offset = IndexKeyOffset();
  kp.rope = index_rope_, kp.stream = s;
  RETURN_IF_ERROR(RunIndexKey(kp));
  RETURN_IF_ERROR(ctx_.Gemm(qa_.get(), c.q_lora_rank, w.index_wq_b, index_.q.get(), ni * di,
                            num_tokens, ni * di, c.q_lora_rank, OutType::kBf16, false));
  RopeParams rp;
  rp.x = index_.q.get(), rp.num_tokens = num_tokens, rp.num_rows = ni;
  rp.token_stride = ni * di, rp.row_stride = di, rp.offset = 0;
  rp.positions = ctx_.in->positions, rp.rope = index_rope_, rp.stream = s;
  RETURN_IF_ERROR(RunRope(rp));
  IndexerParams xp;
  xp.q = index_.q.get(), xp.w = qkv_.get() + ctx_.weights->index_weights_col(), xp.ldw = qkv_w;
  xp.w_scale = 1.0f / std::sqrt(static_cast<float>(ni)),
  xp.scale = 1.0f / std::sqrt(static_cast<float>(di));
  xp.num_tokens = num_tokens, xp.num_heads = ni, xp.head_dim = di, xp.rate = 1,
  xp.top_k = c.indexer.topk;
  xp.seq_lens = ctx_.in->seq_lens;
  xp.key_cache = ctx_.kv().layer(layer), xp.key_row_width = ctx_.kv().row_stride();
  xp.key_offset = IndexKeyOffset();
  xp.block_table = ctx_.in->block_table, xp.max_blocks_per_seq = ctx_.max_blocks_per_seq();
  xp.scores = index_.scores.get(), xp.max_keys = index_.max_keys;
  xp.selected = index_.selected.get(), xp.count = index_.count.get(), xp.stream = s;
  // The tensor-core scores where the shape and the key rows allow them.
  xp.tensor_cores = ctx_.options.indexer_tensor_cores && xp.num_heads == 64 && xp.head_dim == 128 &&
                    xp.key_row_width % 8 == 0 && xp.key_offset % 8 == 0;
  return RunIndexer(xp);
}

absl::Status MlaLayerStack::EnqueueSparseMla(const StepBatch& b, const MlaDecodeParams& mp) {
  const ModelConfig& c = ctx_.config;
  cudaStream_t s = ctx_.stream;
  const int t = b.num_tokens, heads = c.num_attention_heads, rank = c.kv_lora_rank;
  if (sparse_direct_) {
    // The kernel reads each token's selection out of the pool. A decode
    // pass plans at SparseDecodeRows() (the workspace its graph holds).
    MlaDecodeParams sp = mp;
    sp.max_seq_len = b.decode ? SparseDecodeRows() : std::min(c.indexer.topk, b.max_seq_len);
    const MlaDecodePlan plan =
        PlanMlaDecode(t, heads, sp.max_seq_len, ctx_.info.num_sms, sparse_tile_, kv_dtype());
    if (!b.decode && plan.workspace_bytes > prefill_ws_.bytes()) {
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s));  // the old buffer may be in use
      RETURN_IF_ERROR(prefill_ws_.Reallocate(plan.workspace_bytes));
    }
    sp.tile = sparse_tile_, sp.num_splits = plan.num_splits;
    sp.workspace = b.decode ? sparse_ws_.get() : prefill_ws_.get();
    sp.workspace_bytes = b.decode ? sparse_ws_.bytes() : prefill_ws_.bytes();
    return RunMlaDecode(sp);
  }
  const int row = rank + c.qk_rope_head_dim;
  SelectedRowsParams sr;
  sr.selected = index_.selected.get(), sr.count = index_.count.get(), sr.num_tokens = t,
  sr.top_k = c.indexer.topk;
  sr.stride = sparse_.stride, sr.block_table = ctx_.in->block_table,
  sr.max_blocks_per_seq = ctx_.max_blocks_per_seq();
  sr.rows = sparse_rows_.get(), sr.stream = s;
  RETURN_IF_ERROR(RunSelectedRows(sr));
  for (int first = 0; first < t; first += sparse_.tokens) {
    const int n = std::min(sparse_.tokens, t - first);
    GatherRowsParams g;
    g.x = mp.kv_cache, g.ldx = ctx_.kv().row_stride(),
    g.index = sparse_rows_.get() + static_cast<size_t>(first) * sparse_.stride;
    g.rows = n * sparse_.stride, g.cols = row, g.out = sparse_.rows.get(), g.stream = s;
    if (kv_dtype() == KvCacheDtype::kFp8) g.fp8_latent = rank;  // widened exactly
    RETURN_IF_ERROR(RunGatherRows(g));
    MlaDecodeParams sp = mp;
    sp.q = mp.q + static_cast<size_t>(first) * heads * row,
    sp.seq_lens = index_.count.get() + first;
    sp.out = static_cast<bf16*>(mp.out) + static_cast<size_t>(first) * heads * rank;
    RETURN_IF_ERROR(sparse_.Run(ctx_, n, sp));
  }
  return absl::OkStatus();
}

}  // namespace moesh::cuda
