// Attention scratch the families' layer stacks share:
//  * MlaScratch: rows laid out densely for the tuned MLA kernel (V3.2's
//    selections, V4's window + entries): `tokens` queries at a time, query
//    i's rows at [i * stride, (i + 1) * stride) of `rows`, read through the
//    constant block table `table` (stride a multiple of 64);
//  * IndexerScratch: the lightning indexer's queries, scores over up to
//    max_keys keys, the selection and its size per token (V3.2; V4's CSA
//    layers).
#ifndef MOESH_COMMON_CUDA_BACKEND_ATTENTION_SCRATCH_H_
#define MOESH_COMMON_CUDA_BACKEND_ATTENTION_SCRATCH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/cuda_backend/forward_context.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/mla_decode.h"

namespace moesh::cuda {

struct MlaScratch {
  int stride = 0, tokens = 0;
  DeviceBuffer<bf16> rows;
  DeviceBuffer<int32_t> table;
  DeviceBuffer<uint8_t> ws;  // the split partials of any batch up to `tokens`

  // `rows_per_token` (rounded up to 64) rows per query, for
  // min(ctx.max_tokens, max(ctx.max_rows, 256)) queries at a time.
  absl::Status Init(const ForwardContext& ctx, int rows_per_token);
  // The tuned MLA kernel on `n` queries whose rows are here; `mp` gives the
  // queries, their row counts (seq_lens), the output and the scale.
  absl::Status Run(const ForwardContext& ctx, int n, MlaDecodeParams mp) const;
};

struct IndexerScratch {
  int max_keys = 0;
  DeviceBuffer<bf16> q;            // [max_tokens, index_n_heads * index_head_dim]
  DeviceBuffer<float> scores;      // [max_tokens, max_keys]
  DeviceBuffer<int32_t> selected;  // [max_tokens, index_topk]
  DeviceBuffer<int32_t> count;     // [max_tokens]

  absl::Status Init(const ForwardContext& ctx, int max_keys);
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_ATTENTION_SCRATCH_H_
