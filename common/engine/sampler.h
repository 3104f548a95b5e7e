// Token sampling from logits: repetition/presence/frequency penalties, greedy,
// temperature, top-k, top-p, min-p, and top log-probabilities.
//
// The random draw for generated token number `step` depends only on the seed
// and `step`, so a request's first token (sampled by a prefill worker) and the
// rest (sampled by a decode worker) reproduce a single-process run exactly.
// A Sampler belongs to one request; not thread-safe.
#ifndef MOESH_COMMON_ENGINE_SAMPLER_H_
#define MOESH_COMMON_ENGINE_SAMPLER_H_

#include <cstdint>
#include <iterator>
#include <optional>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace moesh {

// Temperatures below this sample greedily (logits / temperature would
// overflow to ties at +inf).
inline constexpr float kMinSamplingTemperature = 1e-5f;
// The most alternatives a served request may ask per position (top_logprobs,
// prompt_logprobs; the OpenAI API's limit): the services refuse more, from
// clients and peers alike (a prompt's entries grow with its length;
// SamplingParams::ValidateServed).
inline constexpr int kMaxLogprobs = 20;

struct SamplingParams {
  float temperature = 0.0f;         // 0 (or below kMinSamplingTemperature): greedy (argmax)
  int top_k = 0;                    // 0: all tokens
  float top_p = 1.0f;               // nucleus mass in (0, 1]
  float min_p = 0.0f;               // drop tokens with p < min_p * p_max, in [0, 1]
  std::optional<uint64_t> seed;     // unset: nondeterministic
  int top_logprobs = 0;             // how many alternatives to report per token
  float repetition_penalty = 1.0f;  // > 0; 1: off. Over prompt and output tokens.
  float presence_penalty = 0.0f;    // [-2, 2], once per distinct output token
  float frequency_penalty = 0.0f;   // [-2, 2], per occurrence in the output
  bool logprobs = false;            // report each sampled token's own log-probability
  // -1: none; k in [0, vocab]: every prompt token's log-probability given the
  // tokens before it, with k alternatives (the prefill pass computes them).
  int prompt_logprobs = -1;

  // INVALID_ARGUMENT naming the parameter if any is out of range.
  absl::Status Validate(int vocab_size) const;
  // Validate, and at most kMaxLogprobs alternatives asked (what the services
  // take, from clients and peers; in-process callers such as the goldens may
  // ask the whole vocabulary).
  absl::Status ValidateServed(int vocab_size) const;
  // Greedy with no penalty: the token is the logits' argmax, whatever the step.
  bool plain_greedy() const { return temperature == 0.0f && !has_penalties(); }
  // The sampled token's own log-probability is reported (asked, or implied
  // by top_logprobs > 0).
  bool wants_logprob() const { return logprobs || top_logprobs > 0; }
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

// Every log-probability here is OpenAI's and vLLM's default ("raw"): the
// natural log of softmax over the model's raw logits, before penalties and
// temperature (and top-k/top-p/min-p) shape the distribution the draw uses.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;  // natural log of softmax(logits)
};

// A prompt's log-probabilities (moesh.v1.PromptLogprobs): of its tokens
// 1..n-1, each given the tokens before it (the first token has none).
struct PromptLogprobs {
  std::vector<float> logprobs;                 // [n - 1]
  std::vector<std::vector<TokenLogprob>> top;  // [n - 1][k], or empty when k == 0

  // Appends the entries of the prompt's next chunk (a prompt scored in chunks).
  void Append(PromptLogprobs chunk) {
    logprobs.insert(logprobs.end(), chunk.logprobs.begin(), chunk.logprobs.end());
    top.insert(top.end(), std::make_move_iterator(chunk.top.begin()),
               std::make_move_iterator(chunk.top.end()));
  }
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  // Picks generated token number `step` (0-based) from logits[vocab], given
  // the prompt and the tokens generated so far (for the penalties):
  // SampleWithDraw(..., Draw(step), ...).
  int32_t Sample(const float* logits, int vocab, int step, absl::Span<const int32_t> prompt,
                 absl::Span<const int32_t> output);
  // The random draw for generated token number `step`, uniform in [0, 1): a
  // function of the seed and `step` only (splitmix64 over the seed's stream,
  // counter-based); 0 for greedy parameters, which use none.
  double Draw(int step) const;
  // The seed whose draws from step 0 on are `seed`'s from step `step` on:
  // Sampler(seed = SeedAtStep(s, k)).Draw(i) == Sampler(seed = s).Draw(k + i)
  // for every i (steps counted as Draw counts them, modulo 2^32). A request
  // continued elsewhere after k generated tokens (its output so far folded
  // into its prompt, router/cluster_backend.h) takes the same draws the
  // uninterrupted request would have.
  static uint64_t SeedAtStep(uint64_t seed, int step);
  // The token `params` pick from logits[vocab] given the draw `u01` in [0, 1):
  // penalties, then argmax (temperature below kMinSamplingTemperature) or,
  // over logits / temperature, the
  // candidates best first (ties to the lower id) cut by top-k, then top-p
  // (the shortest prefix whose mass reaches top_p), then min-p (p >= min_p *
  // p_max); the token is the first candidate whose cumulative mass exceeds
  // u01 * (the kept mass). NaN logits count as -inf; with no finite best
  // logit (+inf, or -inf everywhere) the token is the best candidate. The GPU
  // sampler (kernels/cuda/routing.h) implements the same definition.
  static int32_t SampleWithDraw(const float* logits, int vocab, const SamplingParams& params,
                                double u01, absl::Span<const int32_t> prompt,
                                absl::Span<const int32_t> output);
  // The k most likely tokens under log_softmax(logits), best first.
  static std::vector<TokenLogprob> TopLogprobs(const float* logits, int vocab, int k);
  // log_softmax(logits)[id], as TopLogprobs computes it; id in [0, vocab).
  static float Logprob(const float* logits, int vocab, int32_t id);
  // A prompt's log-probabilities from `logits` [n, vocab], row t the logits
  // after prompt token t: entry t is of prompt[t + 1] under row t, with k
  // alternatives (none when k == 0).
  static PromptLogprobs PromptLogprobsOf(const float* logits, int vocab,
                                         absl::Span<const int32_t> prompt, int k);

 private:
  const SamplingParams params_;
  const uint64_t seed_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_ENGINE_SAMPLER_H_
