// The attention half of a DeepSeek model (embeddings, MLA attention, dense
// MLPs, MoE gates, shared experts, final norm, lm_head), driving routed
// experts through an ExpertClient.
//
// Per decoder layer (DESIGN.md):
//   AttentionStage: x → norm → MLA (+latent cache) → +residual → norm → gate/top-k
//   ExpertStage:    Σ_k w_k · Expert_k(h)          (through the ExpertClient)
//   Combine:        + shared experts → +residual
//
// Thread-safe: Forward is const; concurrent calls need distinct caches.
#ifndef MOESH_COMMON_MODEL_ATTENTION_MODEL_H_
#define MOESH_COMMON_MODEL_ATTENTION_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/model/config.h"
#include "common/model/expert_client.h"
#include "common/model/kv_cache.h"
#include "common/model/weights.h"
#include "kernels/cpu/rope.h"

namespace moesh {

// New tokens of one sequence for a forward pass.
struct SequenceInput {
  absl::Span<const int32_t> tokens;  // appended after the cached prefix
  KvSequence* cache = nullptr;       // the sequence's cache; grows by tokens.size()
};

enum class LogitsFor { kLastToken, kAllTokens };

class AttentionModel {
 public:
  AttentionModel(const ModelConfig& config, std::unique_ptr<AttentionWeights> weights);

  const ModelConfig& config() const { return config_; }
  // Width of a cache row: kv_lora_rank + qk_rope_head_dim (+ index_head_dim
  // for V3.2, whose indexer keys ride along in the same rows).
  int kv_row_width() const { return config_.kv_cache_row_width(); }
  SequenceKvCache NewCache() const {
    return SequenceKvCache(config_.num_hidden_layers, kv_row_width());
  }

  // Runs the new tokens of every sequence through the model as one batch,
  // appending to each cache. Returns logits [num_sequences, vocab] (last token
  // of each) or [total_tokens, vocab] (kAllTokens), float32.
  // INVALID_ARGUMENT for out-of-vocabulary ids, empty inputs, or positions
  // beyond max_position_embeddings (when set); RESOURCE_EXHAUSTED if a cache
  // lacks capacity for its new tokens (checked before anything runs). On other
  // errors caches may hold partial rows and should be discarded.
  //
  // micro_batches > 1 splits the sequences into that many groups and
  // interleaves them layer by layer (ping-pong): while one group's routed
  // experts are in flight (ExpertClient::Start), the next group's attention
  // runs. Results are identical to micro_batches = 1.
  absl::StatusOr<std::vector<float>> Forward(absl::Span<const SequenceInput> seqs,
                                             ExpertClient* experts,
                                             LogitsFor which = LogitsFor::kLastToken,
                                             int micro_batches = 1) const;

 private:
  // x[T, hidden] += attention(norm(x)) for layer l.
  void AttentionBlock(int l, absl::Span<const SequenceInput> seqs, const std::vector<int>& offsets,
                      float* x, int num_tokens) const;
  // The V3.2 indexer's per-token inputs: queries (not yet roped) and head
  // weights; its keys are written, LayerNorm'd but not yet roped, into the
  // cache rows kv[T, kv_row_width] after the MLA part.
  struct IndexerInputs {
    std::vector<float> q;        // [T, index_n_heads, index_head_dim]
    std::vector<float> weights;  // [T, index_n_heads], times index_n_heads^-0.5
  };
  IndexerInputs IndexerProject(const AttentionLayerWeights& w, const float* normed, const float* qa,
                               float* kv, int num_tokens) const;
  // The MLP half of layer l for one micro-batch, in two steps: StartMlp runs
  // a dense MLP to completion, or routes the tokens, starts their dispatch
  // and adds the shared experts; FinishMlp waits and adds the routed output.
  struct MlpInFlight {
    std::vector<float> normed;  // [T, hidden], dispatched
    std::vector<int32_t> ids;   // [T, top_k]
    std::vector<float> weights;
    std::vector<float> routed;                 // [T, hidden], filled by the experts
    std::unique_ptr<PendingDispatch> pending;  // null for dense layers
  };
  absl::Status StartMlp(int l, float* x, int num_tokens, ExpertClient* experts,
                        MlpInFlight* f) const;
  absl::Status FinishMlp(MlpInFlight* f, float* x, int num_tokens) const;

  const ModelConfig config_;
  const std::unique_ptr<AttentionWeights> weights_;
  cpu::RopeTable rope_;
  cpu::RopeLayout rope_layout_;
  float softmax_scale_;
};

// RoPE frequencies for the model's qk_rope_head_dim, plain or YaRN.
cpu::RopeTable MakeRopeTable(const ModelConfig& config);

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_ATTENTION_MODEL_H_
