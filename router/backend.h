// Where the router sends a validated request: a cluster of prefill and decode
// workers (ClusterBackend) or engines in this process (ColocatedBackend). The
// public API layer above them is the same either way.
#ifndef MOESH_ROUTER_BACKEND_H_
#define MOESH_ROUTER_BACKEND_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/engine/sampler.h"

namespace moesh {

// A request after validation: token ids, resolved limits and stop ids.
struct BackendRequest {
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

class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  // Runs the request, feeding `sink` in order, until max_new_tokens, a stop
  // id, the sink declining, or `cancelled()` (polled). OK in the first three
  // cases; CANCELLED in the last; UNAVAILABLE when a worker died;
  // RESOURCE_EXHAUSTED when no worker could take it.
  virtual absl::Status Run(const BackendRequest& request, const ChunkSink& sink,
                           const std::function<bool()>& cancelled) = 0;
  // True when the backend can take requests (workers present).
  virtual bool Ready() const = 0;
};

}  // namespace moesh

#endif  // MOESH_ROUTER_BACKEND_H_
