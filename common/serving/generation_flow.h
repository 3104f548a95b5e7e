// One generation's path through the workers, written once: open the decode
// on a decode worker (which reserves the request's KV blocks and waits for
// them to fill), prefill the prompt (the prefill worker samples the first
// token and moves the KV, the first token with it, into the reservation), and
// relay what the decode worker streams from then on: the first token, then
// one per step. Two calls to the workers per request; the prompt goes to the
// prefill worker, the first token travels with the KV, not back through here.
//
// The workers are reached through two interfaces, each with an in-process
// implementation (the engines of this process: the router's colocated mode;
// common/serving/inprocess_clients.h) and a gRPC one (router/worker_clients.h).
// Plain C++ types throughout; protos are the gRPC clients' business.
//
// Cancellation is an event (base/cancel_token.h): the caller cancels its
// token, and each client wakes on it where it waits (an RPC is cancelled with
// ClientContext::TryCancel, an engine's wait is notified); nothing polls.
#ifndef MOESH_COMMON_SERVING_GENERATION_FLOW_H_
#define MOESH_COMMON_SERVING_GENERATION_FLOW_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/cancel_token.h"
#include "common/engine/sampler.h"

namespace moesh {

// A request id's bound: it is echoed in every message about the request.
constexpr size_t kMaxRequestIdBytes = 256;
// Sibling generations (choices) of one prompt a request may ask for
// (GenerateRequest.n).
constexpr int kMaxChoices = 16;
// INVALID_ARGUMENT "request_id is N bytes; the limit is 256" over the bound
// (or "request_id is empty" when `allow_empty` is false: the workers need one).
absl::Status CheckRequestId(absl::string_view id, bool allow_empty = false);

// A request after validation: token ids, resolved limits and stop ids.
struct GenerationRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_new_tokens = 1;
  std::vector<int32_t> stop_token_ids;  // EOS included unless ignore_eos
  int priority = 0;                     // lower is admitted first, preempted last
};

// Tokens produced since the last chunk.
struct TokenChunk {
  double queue_seconds = 0;  // on the first chunk: time queued before prefill
  int cached_tokens = 0;     // on the first chunk: prompt tokens the prefix cache served
  std::vector<int32_t> ids;
  std::vector<std::vector<TokenLogprob>> logprobs;  // per id, iff requested
  // Per id iff sampling.wants_logprob(): its own log-probability.
  std::vector<float> token_logprobs;
  // On the first chunk iff sampling.prompt_logprobs >= 0.
  std::optional<PromptLogprobs> prompt_logprobs;
};

// Returns false to stop generation early (e.g. a stop string matched).
using ChunkSink = std::function<bool(const TokenChunk&)>;

// What a prefill needs: the prompt, its sampling (for the first token) and
// where the KV goes (the reserving decode worker's data-plane address).
struct PrefillSpec {
  std::string request_id;
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  std::string decode_address;
  // Leading prompt tokens whose rows the decode worker's reservation holds
  // already (DecodeStream::held_tokens): the host KV handoff leaves them out.
  int decode_held_tokens = 0;
};

// What a decode worker needs to hold a request's KV and continue it: its
// prompt (the blocks to reserve, the penalties' history), sampling and stop
// state. The first token comes with the KV (kv_handoff.h).
struct DecodeSpec {
  std::string request_id;
  std::vector<int32_t> prompt_ids;
  SamplingParams sampling;
  int max_new_tokens = 1;  // the first token included
  std::vector<int32_t> stop_token_ids;
  int priority = 0;  // GenerationRequest::priority
  // The decode engine computes the prompt itself, in chunks mixed into its
  // decode steps: no prefill worker and no KV handoff; the first token comes
  // from the engine's own step (the colocated router's chunked prefill, and
  // a cluster's short prompts under --max_local_prefill_tokens).
  bool compute_prompt = false;

  // The tokens whose KV the request may hold: prompt + max_new_tokens - 1.
  int max_tokens() const { return static_cast<int>(prompt_ids.size()) + max_new_tokens - 1; }
};

// A decode step's output for one request, in order; the last has finished.
// A TokenChunk, so it reaches a ChunkSink as it is: the first event carries
// the first token and the time its prompt queued for prefill.
struct TokenEvent : TokenChunk {
  bool finished = false;
  bool stopped = false;  // finished on a stop id
};
// Returns false to stop the request (the receiver wants no more).
using TokenSink = std::function<bool(const TokenEvent&)>;

// A prefill worker. Thread-safe.
class PrefillClient {
 public:
  virtual ~PrefillClient() = default;
  // Blocks until the prompt ran and its KV, with the first token, reached
  // spec.decode_address. INVALID_ARGUMENT for a bad prompt or sampling;
  // UNAVAILABLE when the worker (or an expert worker, or the decode worker)
  // failed; CANCELLED when `cancel` fired first.
  virtual absl::Status Prefill(const PrefillSpec& spec, const CancelToken& cancel) = 0;
};

// A request opened on a decode worker: it holds the request's KV blocks until
// it ends. Destroying it before Relay returned cancels the request (its
// blocks are freed). Not thread-safe.
class DecodeStream {
 public:
  virtual ~DecodeStream() = default;
  // Feeds `sink` the request's events in order, from the first token (once
  // the KV arrived) to the last. OK when it finished or `sink` declined;
  // CANCELLED when the caller's token fired (the worker frees the request's
  // blocks); UNAVAILABLE when the worker failed; DEADLINE_EXCEEDED when the
  // KV did not arrive within the worker's lease. Call once.
  virtual absl::Status Relay(const TokenSink& sink) = 0;
  // Leading prompt tokens whose KV rows the reservation holds already (the
  // decode worker's prefix cache), known once opened.
  virtual int held_tokens() const { return 0; }
};

// A decode worker. Thread-safe.
class DecodeClient {
 public:
  virtual ~DecodeClient() = default;
  // Where prefill workers send this worker's KV (PrefillSpec::decode_address).
  virtual const std::string& kv_address() const = 0;
  // Opens `spec`'s request: returns once blocks for its prompt are reserved
  // (its later tokens' blocks are taken as it decodes), after waiting in the
  // worker's admission queue if the blocks are not free yet.
  // RESOURCE_EXHAUSTED when that queue is full (or the request could never
  // fit); UNAVAILABLE when the worker is gone; INVALID_ARGUMENT for bad
  // sampling or sizes; ALREADY_EXISTS for an id in use there; CANCELLED when
  // `cancel` fired while it waited. `cancel` (which must outlive the stream)
  // cancels the request whenever it fires.
  virtual absl::StatusOr<std::unique_ptr<DecodeStream>> Open(const DecodeSpec& spec,
                                                             const CancelToken& cancel) = 0;
};

// How far a RunGeneration got: for a caller that continues a failed request
// on other workers.
struct GenerationOutcome {
  int decoder = -1;  // index in `decoders` of the worker that took it; -1: none
  // A prefill worker's prefill succeeded (false without one): a later
  // failure was the decode's.
  bool prefilled = false;
};

// Runs `request`: opens it on the first of `decoders` with room (in order; one
// that is full or gone is skipped, any other refusal ends the request),
// prefills on `prefill` — or, when `prefill` is null, has the decode worker
// compute the prompt itself (DecodeSpec::compute_prompt) — then relays the
// decode worker's events to `sink`.
// Returns OK when the request finished (max tokens, a stop id, `sink`
// declined), CANCELLED when `cancel` fired, else the failing worker's error.
// A request that does not decode releases its reservation on every path.
// `outcome` (may be null) receives how far it got.
absl::Status RunGeneration(const GenerationRequest& request, PrefillClient* prefill,
                           absl::Span<DecodeClient* const> decoders, const ChunkSink& sink,
                           const CancelToken& cancel, GenerationOutcome* outcome = nullptr);

// The DecodeSpec of `request` (compute_prompt false).
DecodeSpec DecodeSpecOf(const GenerationRequest& request);

// True when `generated` (the tokens `request` produced so far) ends it:
// max_new_tokens reached, or the last one is a stop id.
bool GenerationDone(const GenerationRequest& request, absl::Span<const int32_t> generated);

// The request that continues `request` after `generated` (its tokens so far,
// not GenerationDone) on other workers: prompt + generated as the prompt, the
// remaining max_new_tokens, the same stop ids. With tokens generated, no
// prompt logprobs (they went out with the first token) and a seed moved on
// past the draws taken (Sampler::SeedAtStep), so:
// - greedy output (no penalty) is the uninterrupted run's, token for token;
// - a seeded sampled request draws what it would have drawn, so it too goes
//   on as the uninterrupted run would (same logits, same draws), unless it
//   has presence or frequency penalties: those count output tokens only, and
//   the continuation sees the earlier output as prompt (repetition_penalty,
//   over prompt and output alike, is unaffected);
// - an unseeded sampled request is random either way: it goes on with fresh
//   draws.
// Logits could differ in the last bits between the first run (one decode
// step per token) and the continuation (one prefill pass over them) on a
// backend whose kernels depend on the batch shape; the CPU backend's do not.
GenerationRequest ContinuationOf(const GenerationRequest& request,
                                 absl::Span<const int32_t> generated);

}  // namespace moesh

#endif  // MOESH_COMMON_SERVING_GENERATION_FLOW_H_
