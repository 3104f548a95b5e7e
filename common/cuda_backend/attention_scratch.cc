#include "common/cuda_backend/attention_scratch.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "base/status.h"
#include "kernels/cuda/config.h"

namespace moesh::cuda {

absl::Status MlaScratch::Init(const ForwardContext& ctx, int rows_per_token) {
  stride = (rows_per_token + kKvBlockSize - 1) / kKvBlockSize * kKvBlockSize;
  tokens = std::min(ctx.max_tokens, std::max(ctx.max_rows, 256));
  RETURN_IF_ERROR(
      rows.Reallocate(static_cast<size_t>(tokens) * stride * (mla::kLatentDim + mla::kRopeDim)));
  std::vector<int32_t> ids(static_cast<size_t>(tokens) * stride / kKvBlockSize);
  std::iota(ids.begin(), ids.end(), 0);
  RETURN_IF_ERROR(table.Reallocate(ids.size()));
  RETURN_IF_ERROR(table.CopyFrom(ids));
  size_t bytes = 0;
  for (int n = 1; n <= tokens; ++n) {
    bytes = std::max(bytes, PlanMlaDecode(n, ctx.config.num_attention_heads, stride,
                                          ctx.info.num_sms, MlaTile(ctx.options.mla_kernel))
                                .workspace_bytes);
  }
  return ws.Reallocate(bytes);
}

absl::Status MlaScratch::Run(const ForwardContext& ctx, int n, MlaDecodeParams mp) const {
  const int per_token = stride / kKvBlockSize;
  const MlaDecodePlan plan =
      PlanMlaDecode(n, mp.num_heads, stride, ctx.info.num_sms, MlaTile(ctx.options.mla_kernel));
  mp.kv_cache = rows.get(), mp.block_table = table.get(), mp.batch = n;
  mp.kv_lora_rank = mla::kLatentDim, mp.rope_dim = mla::kRopeDim;
  mp.num_blocks = tokens * per_token, mp.max_blocks_per_seq = per_token, mp.max_seq_len = stride;
  mp.kv_row_stride = 0, mp.kv_index = nullptr, mp.kv_index_stride = 0;
  mp.kv_dtype = KvCacheDtype::kBf16;  // the dense copy, whatever the pool's rows
  mp.num_splits = plan.num_splits, mp.workspace = ws.get(), mp.workspace_bytes = ws.bytes();
  mp.tile = MlaTile(ctx.options.mla_kernel);
  mp.stream = ctx.stream;
  return RunMlaDecode(mp);
}

absl::Status IndexerScratch::Init(const ForwardContext& ctx, int keys) {
  const ModelConfig& c = ctx.config;
  const size_t t = ctx.max_tokens;
  max_keys = keys;
  RETURN_IF_ERROR(q.Reallocate(t * c.indexer.n_heads * c.indexer.head_dim));
  RETURN_IF_ERROR(scores.Reallocate(t * max_keys));
  RETURN_IF_ERROR(selected.Reallocate(t * c.indexer.topk));
  return count.Reallocate(t);
}

}  // namespace moesh::cuda
