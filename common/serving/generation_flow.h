// One generation's path through the workers, written once: reserve the KV on a
// decode worker, prefill the prompt there (the prefill worker samples the
// first token and moves the KV into the reservation), stop if the first token
// ends it, else decode and relay the tokens.
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
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "base/cancel_token.h"
#include "common/engine/sampler.h"

namespace moesh {

// A request after validation: token ids, resolved limits and stop ids.
struct GenerationRequest {
  std::string request_id;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_new_tokens = 1;
  std::vector<int32_t> stop_token_ids;  // EOS included unless ignore_eos
};

// Tokens produced since the last chunk.
struct TokenChunk {
  double queue_seconds = 0;  // on the first chunk: time queued before prefill
  std::vector<int32_t> ids;
  std::vector<std::vector<TokenLogprob>> logprobs;  // per id, iff requested
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
};

struct PrefillResult {
  int32_t first_token = 0;
  std::vector<TokenLogprob> logprobs;  // iff sampling.top_logprobs > 0
  double queue_seconds = 0;            // waiting for a batch slot
};

// What Decode needs beyond the KV: the request's sampling and stop state.
struct DecodeSpec {
  std::string request_id;
  std::vector<int32_t> prompt_ids;
  int32_t first_token = 0;  // sampled by the prefill worker (step 0)
  SamplingParams sampling;
  int max_new_tokens = 1;  // including first_token
  std::vector<int32_t> stop_token_ids;
};

// A decode step's output for one request, in order; the last has finished.
// A TokenChunk (queue_seconds 0), so it reaches a ChunkSink as it is.
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
  // Blocks until the prompt ran and its KV reached spec.decode_address.
  // INVALID_ARGUMENT for a bad prompt or sampling; UNAVAILABLE when the worker
  // (or an expert worker, or the decode worker) failed; CANCELLED when
  // `cancel` fired first (the KV may still arrive: the caller releases).
  virtual absl::StatusOr<PrefillResult> Prefill(const PrefillSpec& spec,
                                                const CancelToken& cancel) = 0;
};

// A decode worker. Thread-safe.
class DecodeClient {
 public:
  virtual ~DecodeClient() = default;
  // Where prefill workers send this worker's KV (PrefillSpec::decode_address).
  virtual const std::string& kv_address() const = 0;
  // Reserves blocks for max_tokens tokens of a request. RESOURCE_EXHAUSTED
  // when they are not free; UNAVAILABLE when the worker is gone.
  virtual absl::Status Reserve(const std::string& request_id, int prompt_tokens,
                               int max_tokens) = 0;
  // Frees a reservation (best effort: the worker's lease frees it otherwise).
  virtual void Release(const std::string& request_id) = 0;
  // Decodes a reserved request whose KV arrived, feeding `sink` in order.
  // OK when it finished or `sink` declined; CANCELLED when `cancel` fired
  // (the worker frees the request's blocks); UNAVAILABLE when the worker failed.
  virtual absl::Status Decode(const DecodeSpec& spec, const TokenSink& sink,
                              const CancelToken& cancel) = 0;
};

// Runs `request`: reserves on the first of `decoders` with room (in order;
// one that is full or gone is skipped, any other refusal ends the request),
// prefills on `prefill`, then decodes there, feeding `sink`. Returns OK when
// the request finished (max tokens, a stop id, `sink` declined), CANCELLED
// when `cancel` fired, else the failing worker's error. The reservation is
// released on every path that does not decode.
absl::Status RunGeneration(const GenerationRequest& request, PrefillClient& prefill,
                           absl::Span<DecodeClient* const> decoders, const ChunkSink& sink,
                           const CancelToken& cancel);

}  // namespace moesh

#endif  // MOESH_COMMON_SERVING_GENERATION_FLOW_H_
