// AttentionBackend: where a serving engine's attention half runs — the
// model's non-expert weights, the pool its sequences' KV caches come from,
// and the batched forward pass whose routed experts go through an
// ExpertClient. The prefill and decode engines and `moesh generate` are
// written against it; implementations:
//   * NewCpuAttentionBackend (here): AttentionModel in fp32, KV rows in a
//     KvBlockPool (or unbounded per-sequence vectors);
//   * common/cuda_backend's CUDA backend: CudaModel on one GPU, bf16 weights,
//     the paged latent cache in device memory (common/backend/backends.h
//     makes either from a `--device` flag).
//
// Sequences come from NewSequence and are only passed to the backend that
// made them. Thread-safety: the implementation's to state (both here are
// thread-safe; a sequence has one owner at a time).
#ifndef MOESH_COMMON_ENGINE_ATTENTION_BACKEND_H_
#define MOESH_COMMON_ENGINE_ATTENTION_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/engine/paged_kv_cache.h"
#include "common/engine/sampler.h"
#include "common/model/attention_model.h"
#include "common/model/config.h"
#include "common/model/expert_client.h"
#include "common/model/kv_cache.h"

namespace moesh {

// KV cache blocks of the backend's pool (0 blocks: unbounded).
struct KvUsage {
  int total_blocks = 0;
  int free_blocks = 0;
  int block_size = 0;  // tokens per block
  // Fraction of the blocks in use, [0, 1] (0 without a pool).
  double used_fraction() const {
    return total_blocks > 0 ? 1.0 - static_cast<double>(free_blocks) / total_blocks : 0.0;
  }
};

// How a forward pass picks one sequence's next token:
// Sampler::SampleWithDraw(logits, params, draw, prompt, output).
struct SampleRequest {
  const SamplingParams* params = nullptr;  // valid for the vocabulary
  double draw = 0.0;                       // in [0, 1): Sampler::Draw(step)
  absl::Span<const int32_t> prompt;        // for the penalties
  absl::Span<const int32_t> output;        // the tokens generated so far
  // -1: none. k >= 0: the log-probabilities of this pass's input tokens
  // 1..n-1, each under the position before it, with k alternatives each:
  // SampledTokens::prompt_logprobs. A prompt in one pass starts on an empty
  // cache; one in chunks (each on the cache of those before) names the
  // next chunk's first token in `prompt_next`, which the last position
  // scores too (n entries then), so the chunks' entries joined are the
  // whole prompt's.
  int prompt_logprobs = -1;
  int32_t prompt_next = -1;  // -1: none (the prompt's last chunk, or whole)
};

// The tokens a forward pass picked, one per sequence.
struct SampledTokens {
  std::vector<int32_t> ids;
  // [num_sequences][k]: the k most likely tokens under log_softmax of the raw
  // logits (before penalties and temperature), best first; empty iff k == 0.
  std::vector<std::vector<TokenLogprob>> top_logprobs;
  // [num_sequences]: the chosen token's own log-probability under the same
  // raw log_softmax, where its request's params->wants_logprob() (else 0).
  std::vector<float> logprobs;
  // [num_sequences]: where the sample request asked for prompt_logprobs, the
  // input tokens' (Sampler::PromptLogprobsOf); empty otherwise.
  std::vector<PromptLogprobs> prompt_logprobs;
};

class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;

  virtual const ModelConfig& config() const = 0;
  // "cpu", "cuda:0", ...
  virtual std::string device() const = 0;

  // An empty sequence whose cache can hold `max_tokens` tokens, its blocks
  // taken now. RESOURCE_EXHAUSTED if the pool lacks them, INVALID_ARGUMENT
  // beyond the backend's context limit. The sequence returns its blocks when
  // destroyed.
  virtual absl::StatusOr<std::unique_ptr<KvSequence>> NewSequence(int max_tokens) = 0;
  // NewSequence's, starting with the rows of the longest cached prefix of
  // `tokens` (the prompt, or prompt + output of a resumed request) where the
  // backend keeps a prefix cache (KvBlockPool's contract: full blocks only,
  // at most tokens.size() - 1 tokens; the sequence's cached_tokens() and
  // length() say how many), so the caller computes only the rest. This
  // default (a backend without a prefix cache) is NewSequence.
  virtual absl::StatusOr<std::unique_ptr<KvSequence>> NewCachedSequence(
      int max_tokens, absl::Span<const int32_t> tokens) {
    (void)tokens;
    return NewSequence(max_tokens);
  }
  // The prefix cache's counters (all zero without one).
  virtual PrefixCacheStats prefix_cache_stats() const { return {}; }
  // Up to `max` block hashes (PrefixBlockHashes) of what the prefix cache
  // holds, most useful first; empty without one.
  virtual std::vector<uint64_t> CachedBlockHashes(int max) const {
    (void)max;
    return {};
  }

  // AttentionModel::Forward's contract (LogitsFor::kLastToken: logits
  // [num_sequences, vocab], float32) over sequences from NewSequence, the
  // routed experts behind `experts`, which is null iff has_experts().
  // micro_batches > 1 asks for ping-pong micro-batching where the backend
  // implements it (CPU); others run the batch whole, with the same result.
  virtual absl::StatusOr<std::vector<float>> Forward(absl::Span<const SequenceInput> seqs,
                                                     ExpertClient* experts,
                                                     int micro_batches = 1) = 0;

  // Forward with LogitsFor::kAllTokens: logits [total new tokens, vocab],
  // sequence by sequence. UNIMPLEMENTED where the backend computes the LM
  // head for last positions only (CUDA).
  virtual absl::StatusOr<std::vector<float>> ForwardAllPositions(
      absl::Span<const SequenceInput> seqs, ExpertClient* experts);
  // True iff ForwardAllPositions is implemented (prompt log-probabilities).
  virtual bool has_all_position_logits() const { return false; }

  // Forward, then each sequence's token as `samples` say (one per sequence),
  // its own log-probability where asked, its `top_logprobs` (in [0, vocab])
  // most likely alternatives, and prompt log-probabilities where a sample
  // request asks (through ForwardAllPositions). Here from the logits on the
  // host; the CUDA backend keeps the logits on the device (sampling there,
  // replaying a CUDA graph for decode steps) and only the tokens and
  // log-probabilities leave it.
  virtual absl::StatusOr<SampledTokens> ForwardSample(absl::Span<const SequenceInput> seqs,
                                                      ExpertClient* experts,
                                                      absl::Span<const SampleRequest> samples,
                                                      int top_logprobs, int micro_batches = 1);

  virtual KvUsage kv_usage() const = 0;
  // True iff the routed experts live in the backend (a CUDA model loaded
  // with them); Forward then takes no ExpertClient.
  virtual bool has_experts() const { return false; }

 protected:
  // ForwardSample's argument checks: one valid request per sequence, draws in
  // [0, 1), tokens and top_logprobs within the vocabulary (INVALID_ARGUMENT).
  absl::Status CheckSampleRequests(absl::Span<const SequenceInput> seqs,
                                   absl::Span<const SampleRequest> samples, int top_logprobs) const;
};

// A prompt `backend` can run: INVALID_ARGUMENT for a token outside the
// vocabulary, UNIMPLEMENTED for prompt_logprobs >= 0 where the backend lacks
// ForwardAllPositions.
absl::Status CheckPrompt(const AttentionBackend& backend, absl::Span<const int32_t> prompt,
                         int prompt_logprobs);

// The CPU backend over `model`. num_kv_blocks > 0: a KvBlockPool of that
// many blocks of block_size tokens, with a prefix cache iff `prefix_cache`;
// 0: every sequence grows without bound (no prefix cache). Either way the
// rows are stored as `kv_format` gives them back (--kv_cache_dtype fp8).
std::unique_ptr<AttentionBackend> NewCpuAttentionBackend(std::unique_ptr<AttentionModel> model,
                                                         int num_kv_blocks, int block_size,
                                                         bool prefix_cache = false,
                                                         KvRowFormat kv_format = {});
// The same over a borrowed model, which must outlive the backend.
std::unique_ptr<AttentionBackend> NewCpuAttentionBackend(const AttentionModel* model,
                                                         int num_kv_blocks, int block_size,
                                                         bool prefix_cache = false,
                                                         KvRowFormat kv_format = {});

}  // namespace moesh

#endif  // MOESH_COMMON_ENGINE_ATTENTION_BACKEND_H_
