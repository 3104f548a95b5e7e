#include "common/engine/generate.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace moesh {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
  }
  return "?";
}

absl::StatusOr<GenerationResult> Generate(const Model& model, absl::Span<const int32_t> prompt,
                                          const SamplingParams& sampling, const StopParams& stop) {
  std::unique_ptr<AttentionBackend> backend = NewCpuAttentionBackend(&model.attention(), 0, 1);
  return Generate(backend.get(), model.experts(), prompt, sampling, stop);
}

absl::StatusOr<GenerationResult> Generate(AttentionBackend* backend, ExpertClient* experts,
                                          absl::Span<const int32_t> prompt,
                                          const SamplingParams& sampling, const StopParams& stop) {
  const ModelConfig& c = backend->config();
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  RETURN_IF_ERROR(sampling.Validate(c.vocab_size));
  if (stop.max_new_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_new_tokens must be >= 1, got ", stop.max_new_tokens));
  }
  const int64_t needed = static_cast<int64_t>(prompt.size()) + stop.max_new_tokens - 1;
  if (c.max_position_embeddings > 0 && needed > c.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt (", prompt.size(), " tokens) + max_new_tokens (", stop.max_new_tokens,
                     ") exceeds the model's context of ", c.max_position_embeddings, " tokens"));
  }
  std::vector<int32_t> stop_ids = stop.stop_token_ids;
  if (!stop.ignore_eos)
    stop_ids.insert(stop_ids.end(), c.eos_token_ids.begin(), c.eos_token_ids.end());

  GenerationResult result;
  result.prompt_tokens = static_cast<int>(prompt.size());
  Sampler sampler(sampling);
  ASSIGN_OR_RETURN(std::unique_ptr<KvSequence> cache,
                   backend->NewSequence(static_cast<int>(std::min<int64_t>(needed, INT32_MAX))));
  // Every token through the backend's sampling step, as the workers do it
  // (on a GPU the logits stay there).
  std::vector<int32_t> next(prompt.begin(), prompt.end());
  while (true) {
    SequenceInput in{next, cache.get()};
    const bool first = result.output_ids.empty();
    const SampleRequest req{&sampling, sampler.Draw(static_cast<int>(result.output_ids.size())),
                            prompt, result.output_ids, first ? sampling.prompt_logprobs : -1};
    ASSIGN_OR_RETURN(SampledTokens chosen,
                     backend->ForwardSample(absl::MakeConstSpan(&in, 1), experts,
                                            absl::MakeConstSpan(&req, 1), sampling.top_logprobs));
    const int32_t token = chosen.ids[0];
    if (sampling.top_logprobs > 0) result.top_logprobs.push_back(std::move(chosen.top_logprobs[0]));
    if (sampling.wants_logprob()) result.logprobs.push_back(chosen.logprobs[0]);
    if (first && sampling.prompt_logprobs >= 0)
      result.prompt_logprobs = std::move(chosen.prompt_logprobs[0]);
    result.output_ids.push_back(token);
    if (std::find(stop_ids.begin(), stop_ids.end(), token) != stop_ids.end()) {
      result.finish_reason = FinishReason::kStop;
      break;
    }
    if (static_cast<int>(result.output_ids.size()) >= stop.max_new_tokens) {
      result.finish_reason = FinishReason::kLength;
      break;
    }
    next.assign(1, token);
  }
  return result;
}

}  // namespace moesh
