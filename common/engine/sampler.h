// Token sampling from logits: greedy, temperature, top-k, top-p, min-p, with a
// seedable generator, and top log-probabilities.
//
// A Sampler belongs to one request (its generator advances per token); not
// thread-safe.
#ifndef MOESH_COMMON_ENGINE_SAMPLER_H_
#define MOESH_COMMON_ENGINE_SAMPLER_H_

#include <cstdint>
#include <optional>
#include <random>
#include <vector>

#include "absl/status/status.h"

namespace moesh {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy (argmax)
  int top_k = 0;             // 0: all tokens
  float top_p = 1.0f;        // nucleus mass in (0, 1]
  float min_p = 0.0f;        // drop tokens with p < min_p * p_max, in [0, 1]
  std::optional<uint64_t> seed;  // unset: nondeterministic
  int top_logprobs = 0;      // how many alternatives to report per token

  // INVALID_ARGUMENT naming the parameter if any is out of range.
  absl::Status Validate(int vocab_size) const;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;  // natural log of softmax(logits)
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks the next token from logits[vocab].
  int32_t Sample(const float* logits, int vocab);
  // The k most likely tokens under log_softmax(logits), best first.
  static std::vector<TokenLogprob> TopLogprobs(const float* logits, int vocab, int k);

 private:
  const SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> scratch_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_ENGINE_SAMPLER_H_
