// Where the router sends a validated request: a cluster of prefill and decode
// workers (ClusterBackend) or engines in this process (ColocatedBackend). Both
// run the one request flow (common/serving/generation_flow.h), over gRPC or
// in-process clients; the public API layer above them is the same either way.
#ifndef MOESH_ROUTER_BACKEND_H_
#define MOESH_ROUTER_BACKEND_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/serving/generation_flow.h"

namespace moesh {

class GenerationBackend {
 public:
  virtual ~GenerationBackend() = default;
  // Runs the request, feeding `sink` in order, until max_new_tokens, a stop
  // id, the sink declining, or `cancel` firing (an event: the workers' calls
  // are cancelled at once). OK in the first three cases; CANCELLED in the
  // last; UNAVAILABLE when a worker died; RESOURCE_EXHAUSTED when no worker
  // could take it.
  virtual absl::Status Run(const GenerationRequest& request, const ChunkSink& sink,
                           const CancelToken& cancel) = 0;
  // True when the backend can take requests (workers present).
  virtual bool Ready() const = 0;
};

}  // namespace moesh

#endif  // MOESH_ROUTER_BACKEND_H_
