// Disaggregated serving: for each request the router orders the decode
// workers (lowest KV usage, then fewest running) and picks a prefill worker
// (fewest queued prompt tokens), then runs the request flow
// (common/serving/generation_flow.h) over their gRPC clients
// (router/worker_clients.h). Thread-safe.
#ifndef MOESH_ROUTER_CLUSTER_BACKEND_H_
#define MOESH_ROUTER_CLUSTER_BACKEND_H_

#include <map>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "moesh/v1/worker.grpc.pb.h"
#include "router/backend.h"
#include "router/membership.h"

namespace moesh {

class ClusterBackend : public GenerationBackend {
 public:
  // `membership` is borrowed and must outlive the backend.
  explicit ClusterBackend(Membership* membership) : registry_(&membership->registry()) {}

  absl::Status Run(const GenerationRequest& request, const ChunkSink& sink,
                   const CancelToken& cancel) override;
  bool Ready() const override;

 private:
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);

  WorkerRegistry* const registry_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moesh

#endif  // MOESH_ROUTER_CLUSTER_BACKEND_H_
