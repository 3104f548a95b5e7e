// Disaggregated serving: for each request the router picks a decode worker
// (lowest KV usage, then fewest running) and reserves its KV blocks, picks a
// prefill worker (fewest queued prompt tokens) that runs the prompt and moves
// the KV into the reservation, then relays the decode worker's token stream.
// Thread-safe.
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
  explicit ClusterBackend(Membership* membership) : membership_(membership) {}

  absl::Status Run(const BackendRequest& request, const ChunkSink& sink,
                   const std::function<bool()>& cancelled) override;
  bool Ready() const override;

 private:
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);

  Membership* const membership_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moesh

#endif  // MOESH_ROUTER_CLUSTER_BACKEND_H_
