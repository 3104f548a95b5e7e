// The router's moesh.v1.Cluster service: the RPC edge over the worker
// registry (router/worker_registry.h: registration, heartbeats, liveness, the
// placement map) and the rebalancer (router/rebalancer.h: EPLB), which it owns.
// Every request field is checked first (router/cluster_validation.h:
// INVALID_ARGUMENT naming the field); only checked values reach them.
//
// Thread-safe.
#ifndef MOESH_ROUTER_MEMBERSHIP_H_
#define MOESH_ROUTER_MEMBERSHIP_H_

#include <chrono>
#include <functional>
#include <string>

#include "common/metrics/metrics.h"
#include "moesh/v1/worker.grpc.pb.h"
#include "router/cluster_validation.h"
#include "router/rebalancer.h"
#include "router/worker_registry.h"

namespace moesh {

class Membership final : public v1::Cluster::Service {
 public:
  // `metrics` may be null; `limits.num_experts` is the model's routed experts.
  Membership(std::string model_fingerprint, ClusterLimits limits,
             std::chrono::milliseconds heartbeat_interval, std::chrono::milliseconds timeout,
             RebalancePolicy rebalance = {}, Metrics* metrics = nullptr);

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status GetPlacement(grpc::ServerContext*, const v1::GetPlacementRequest*,
                            v1::PlacementMap* response) override;
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest* request,
                          v1::DeregisterResponse*) override;
  grpc::Status Rebalance(grpc::ServerContext*, const v1::RebalanceRequest* request,
                         v1::RebalanceResponse* response) override;

  WorkerRegistry& registry() { return registry_; }
  Rebalancer& rebalancer() { return rebalancer_; }
  // Called (outside the lock) whenever the set of live workers changes.
  void OnChange(std::function<void()> callback) { registry_.OnChange(std::move(callback)); }

 private:
  const ClusterLimits limits_;
  WorkerRegistry registry_;
  Rebalancer rebalancer_;  // after registry_: stops first
};

}  // namespace moesh

#endif  // MOESH_ROUTER_MEMBERSHIP_H_
