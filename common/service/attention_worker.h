// What prefill and decode workers share at startup: the attention half of the
// model on its device, the data-plane transport, and an ExpertClient —
// remote (expert workers found through their ExpertWorker.Info) or local
// (experts loaded in this process; on a CUDA device they live in the backend).
#ifndef MOESH_COMMON_SERVICE_ATTENTION_WORKER_H_
#define MOESH_COMMON_SERVICE_ATTENTION_WORKER_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/backends.h"
#include "common/engine/attention_backend.h"
#include "common/model/expert_client.h"
#include "common/service/dispatch_flags.h"
#include "common/service/heartbeat_client.h"
#include "common/service/server_flags.h"
#include "common/service/worker_flags.h"
#include "common/transport/remote_expert_client.h"
#include "common/transport/transport.h"

namespace moesh {

struct AttentionWorkerOptions {
  std::string model_dir;
  // Where the routed experts are, in order of precedence: these expert worker
  // control addresses; else the router's placement map (when `router` is
  // set), followed as it changes; else every expert loaded locally.
  std::vector<std::string> expert_workers;
  std::string router;
  std::string transport = "grpc";
  // --dispatch_dtype (ParseDispatchDType): the host wire's encoding of dispatches.
  std::string dispatch_dtype = "fp32";
  // How long to wait for expert workers to come up.
  std::chrono::seconds discovery_timeout{60};
  Metrics* metrics = nullptr;  // may be null
  // Where attention (and local experts) run, and the KV pool.
  DeviceOptions device;
};

// The options of a prefill or decode worker from its flag groups.
AttentionWorkerOptions AttentionWorkerOptionsFrom(const ServerOptions& server,
                                                  const WorkerOptions& worker,
                                                  const ExpertDispatchOptions& dispatch,
                                                  const DeviceOptions& device, Metrics* metrics);

struct AttentionWorker {
  ModelConfig config;
  std::unique_ptr<AttentionBackend> backend;
  std::unique_ptr<Transport> transport;  // to the expert workers
  // With --transport nccl, gRPC for the KV handoff (NCCL cannot connect two
  // processes on one GPU); null otherwise.
  std::unique_ptr<Transport> grpc_for_kv;
  // For the KV handoff to decode workers.
  Transport* kv_transport() const {
    return grpc_for_kv != nullptr ? grpc_for_kv.get() : transport.get();
  }
  // Null iff backend->has_experts() (local experts on a CUDA device).
  std::unique_ptr<ExpertClient> experts;
  // Set when the placement comes from the router: call on a new placement
  // version of the placement writer (HeartbeatClient's on_placement_version).
  // Thread-safe.
  PlacementFollower on_placement_version;
};

// A router's placement map as an ExpertPlacement, waiting (up to `timeout`)
// until every expert in [0, num_experts) has a live host. `routers` as
// --router takes it: the first of its addresses (in order, the placement
// writer's rule) whose map is complete.
absl::StatusOr<ExpertPlacement> FetchPlacement(const std::string& routers, int num_experts,
                                               std::chrono::seconds timeout);

absl::StatusOr<AttentionWorker> SetUpAttentionWorker(const AttentionWorkerOptions& options);

// Asks each expert worker which experts it hosts, retrying until `timeout`.
// FAILED_PRECONDITION if one serves another model (fingerprint mismatch).
absl::StatusOr<ExpertPlacement> DiscoverPlacement(const std::vector<std::string>& addresses,
                                                  const std::string& fingerprint,
                                                  std::chrono::seconds timeout);

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_ATTENTION_WORKER_H_
