// Single-request generation on a colocated Model: prefill the prompt, then
// decode one token per step with the latent cache until a stop condition.
#ifndef MOESH_COMMON_ENGINE_GENERATE_H_
#define MOESH_COMMON_ENGINE_GENERATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/engine/attention_backend.h"
#include "common/engine/sampler.h"
#include "common/model/model.h"

namespace moesh {

struct StopParams {
  int max_new_tokens = 16;
  bool ignore_eos = false;              // keep going past the model's EOS ids
  std::vector<int32_t> stop_token_ids;  // extra ids that end generation
};

enum class FinishReason { kLength, kStop };
const char* FinishReasonName(FinishReason r);  // "length" | "stop"

struct GenerationResult {
  std::vector<int32_t> output_ids;                      // includes the stop token when one ended it
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // per output token iff requested
  // Per output token iff sampling.wants_logprob(): its own log-probability.
  std::vector<float> logprobs;
  // Iff sampling.prompt_logprobs >= 0: the prompt's, from the prefill pass.
  PromptLogprobs prompt_logprobs;
  FinishReason finish_reason = FinishReason::kLength;
  int prompt_tokens = 0;
};

// INVALID_ARGUMENT for an empty prompt, bad ids, bad parameters, or a
// prompt + max_new_tokens beyond the model's max_position_embeddings.
// `experts` is null iff backend->has_experts().
absl::StatusOr<GenerationResult> Generate(AttentionBackend* backend, ExpertClient* experts,
                                          absl::Span<const int32_t> prompt,
                                          const SamplingParams& sampling, const StopParams& stop);
// The same on the CPU, with the model's own experts.
absl::StatusOr<GenerationResult> Generate(const Model& model, absl::Span<const int32_t> prompt,
                                          const SamplingParams& sampling, const StopParams& stop);

}  // namespace moesh

#endif  // MOESH_COMMON_ENGINE_GENERATE_H_
