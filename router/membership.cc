#include "router/membership.h"

#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"

namespace moesh {
namespace {

void PlacementToProto(const PlacementMap& map, v1::PlacementMap* p) {
  p->set_version(map.version);
  for (const PlacementMap::Worker& w : map.workers) {
    v1::PlacementMap::Worker* pw = p->add_workers();
    pw->set_data_plane_address(w.data_plane_address);
    pw->mutable_expert_ids()->Add(w.expert_ids.begin(), w.expert_ids.end());
  }
}

}  // namespace

Membership::Membership(std::string model_fingerprint, ClusterLimits limits,
                       std::chrono::milliseconds heartbeat_interval,
                       std::chrono::milliseconds timeout, RebalancePolicy rebalance,
                       Metrics* metrics)
    : limits_(limits),
      registry_(std::move(model_fingerprint), heartbeat_interval, timeout),
      rebalancer_(&registry_, rebalance, metrics) {
  if (metrics == nullptr) return;
  auto& family = metrics->GaugeFamily(
      "moesh_router_workers",
      "Workers this router holds as members (registered, heartbeating, not draining), by kind; "
      "updated as workers join and leave.");
  std::vector<std::pair<v1::WorkerKind, prometheus::Gauge*>> gauges;
  for (v1::WorkerKind kind :
       {v1::WORKER_KIND_PREFILL, v1::WORKER_KIND_DECODE, v1::WORKER_KIND_EXPERT}) {
    gauges.push_back(
        {kind,
         &family.Add({{"kind", absl::AsciiStrToLower(v1::WorkerKind_Name(kind).substr(12))}})});
  }
  registry_.OnChange([this, gauges] {
    for (const auto& [kind, gauge] : gauges)
      gauge->Set(static_cast<double>(registry_.Live(kind).size()));
  });
}

grpc::Status Membership::Register(grpc::ServerContext* ctx, const v1::RegisterRequest* request,
                                  v1::RegisterResponse* response) {
  if (absl::Status s = CheckAuthenticatedPeer(*ctx, "Cluster.Register"); !s.ok())
    return ToGrpcStatus(s);
  if (absl::Status s = ValidateRegistration(*request, limits_); !s.ok()) return ToGrpcStatus(s);
  WorkerRegistration r;
  r.kind = request->kind();
  r.address = request->address();
  r.data_plane_address = request->data_plane_address();
  r.expert_ids.assign(request->expert_ids().begin(), request->expert_ids().end());
  r.model_fingerprint = request->model_fingerprint();
  r.computes_prompts = request->computes_prompts();
  absl::StatusOr<std::string> id = registry_.Register(r);
  if (!id.ok()) return ToGrpcStatus(id.status());
  response->set_worker_id(*id);
  response->set_heartbeat_interval_ms(static_cast<int>(registry_.heartbeat_interval().count()));
  return grpc::Status::OK;
}

grpc::Status Membership::Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* request,
                                   v1::HeartbeatResponse* response) {
  if (absl::Status s = CheckAuthenticatedPeer(*ctx, "Cluster.Heartbeat"); !s.ok())
    return ToGrpcStatus(s);
  if (absl::Status s = ValidateHeartbeat(*request, limits_); !s.ok()) return ToGrpcStatus(s);
  const WorkerRegistry::HeartbeatAnswer a =
      registry_.Heartbeat(request->worker_id(), request->load(), request->placement_version(),
                          request->placement_elsewhere());
  response->set_known(a.known);
  response->set_placement_version(a.placement_version);
  return grpc::Status::OK;
}

grpc::Status Membership::GetPlacement(grpc::ServerContext*, const v1::GetPlacementRequest*,
                                      v1::PlacementMap* response) {
  PlacementToProto(registry_.Placement(), response);
  return grpc::Status::OK;
}

grpc::Status Membership::Deregister(grpc::ServerContext* ctx, const v1::DeregisterRequest* request,
                                    v1::DeregisterResponse*) {
  if (absl::Status s = CheckAuthenticatedPeer(*ctx, "Cluster.Deregister"); !s.ok())
    return ToGrpcStatus(s);
  if (absl::Status s = ValidateWorkerId(request->worker_id()); !s.ok()) return ToGrpcStatus(s);
  registry_.Deregister(request->worker_id());
  return grpc::Status::OK;
}

grpc::Status Membership::Rebalance(grpc::ServerContext* ctx, const v1::RebalanceRequest* request,
                                   v1::RebalanceResponse* response) {
  if (absl::Status s = CheckAuthenticatedPeer(*ctx, "Cluster.Rebalance"); !s.ok())
    return ToGrpcStatus(s);
  if (absl::Status s = ValidateSlotsPerWorker(request->slots_per_worker(), limits_); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<RebalanceResult> r = rebalancer_.Run(request->slots_per_worker());
  if (!r.ok()) return ToGrpcStatus(r.status());
  response->set_balance_ratio_before(r->balance_ratio_before);
  response->set_balance_ratio_after(r->balance_ratio_after);
  response->set_placement_version(r->placement_version);
  PlacementToProto(r->placement, response->mutable_placement());
  return grpc::Status::OK;
}

}  // namespace moesh
