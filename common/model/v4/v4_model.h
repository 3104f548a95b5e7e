// The DeepSeek-V4 forward pass (AttentionModel::Forward runs it for V4
// checkpoints): mHC residual streams around every sublayer; shared-KV MQA over
// a sliding window plus, per layer type, compressed entries (HCA: all of them;
// CSA: the index_topk an indexer picks), attention sinks, the inverse RoPE on
// the output and the grouped output projection; sqrt-softplus or hash routing
// to the routed experts (through the ExpertClient, as for V2/V3) and a
// clamped-SwiGLU shared expert.
//
// Cache rows (KvSequence, one per token per layer; row_width is the widest
// layer's, narrower layers leave the tail unused):
//   [kv: head_dim, normalised and roped (the sliding window's key and value)
//    | compressor kv: c * head_dim | compressor gate: c * head_dim
//    | (CSA) indexer compressor kv: 2 * index_head_dim | its gate: 2 * index_head_dim]
// with c = 2 (CSA) or 1 (HCA) or 0 (sliding). Compressed entries are a pure
// function of these rows, so prefill, decode and the KV handoff need no other
// state: each forward pools the windows its queries can see.
//
// Not yet: micro-batching (Forward's micro_batches is ignored for V4; the
// routed experts run through ExpertClient::Run), a sliding-window ring (rows
// of every token are kept, only the last sliding_window are read), caching
// the pooled entries between forwards.
#ifndef MOESH_COMMON_MODEL_V4_V4_MODEL_H_
#define MOESH_COMMON_MODEL_V4_V4_MODEL_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/attention_model.h"
#include "common/model/config.h"
#include "common/model/expert_client.h"
#include "common/model/weights.h"
#include "kernels/cpu/rope.h"

namespace moesh {

// V4's RoPE frequencies (main or compress) over `dim` dims, plain or YaRN
// (an unset original_max_position_embeddings stays unset, as transformers
// leaves it for V4).
cpu::RopeTable V4RopeTable(const RopeConfig& rope, int dim);

// REQUIRES: config.layers() == LayerArch::kV4; the inputs validated as Forward does; offsets[s]
// the first row of sequence s among the `total` new tokens.
absl::StatusOr<std::vector<float>> ForwardV4(const ModelConfig& config,
                                             const AttentionWeights& weights,
                                             absl::Span<const SequenceInput> seqs,
                                             const std::vector<int>& offsets, int total,
                                             ExpertClient* experts, LogitsFor which);

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_V4_V4_MODEL_H_
