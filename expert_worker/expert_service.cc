#include "expert_worker/expert_service.h"

#include <vector>

#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"

namespace moesh {

ExpertService::ExpertService(std::unique_ptr<ExpertStage> stage, std::string fingerprint,
                             ExpertServiceOptions options)
    : dispatcher_(std::move(stage), std::move(options)), fingerprint_(std::move(fingerprint)) {}

absl::Status ExpertService::Dispatch(const MoeDispatch& dispatch, float* out) {
  in_flight_.fetch_add(1);
  absl::Status s = dispatcher_.Dispatch(dispatch, out);
  last_dispatch_end_.store(std::chrono::steady_clock::now().time_since_epoch().count());
  in_flight_.fetch_sub(1);
  return s;
}

int ExpertService::InFlight(std::chrono::steady_clock::duration quiet) const {
  const int now_serving = in_flight_.load();
  const int64_t last = last_dispatch_end_.load();
  const bool recent =
      last != 0 &&
      std::chrono::steady_clock::now().time_since_epoch().count() - last < quiet.count();
  return now_serving + (recent ? 1 : 0);
}

grpc::Status ExpertService::Info(grpc::ServerContext*, const v1::ExpertInfoRequest*,
                                 v1::ExpertInfoResponse* response) {
  for (int e : dispatcher_.hosted_experts()) response->add_expert_ids(e);
  response->set_model_fingerprint(fingerprint_);
  response->set_data_plane_address(data_plane_address_);
  return grpc::Status::OK;
}

grpc::Status ExpertService::LoadExperts(grpc::ServerContext* ctx,
                                        const v1::LoadExpertsRequest* request,
                                        v1::LoadExpertsResponse* response) {
  if (absl::Status s = CheckAuthenticatedPeer(*ctx, "ExpertWorker.LoadExperts"); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<std::set<int>> hosted = dispatcher_.LoadExperts(
      {request->expert_ids().begin(), request->expert_ids().end()}, request->exact());
  if (!hosted.ok()) return ToGrpcStatus(hosted.status());
  for (int e : *hosted) response->add_expert_ids(e);
  return grpc::Status::OK;
}

v1::WorkerLoad ExpertService::Load() const {
  v1::WorkerLoad load;
  const std::vector<int64_t> tokens = dispatcher_.expert_load();
  load.mutable_expert_tokens()->Add(tokens.begin(), tokens.end());
  // What the routers that did not place this worker's experts route to (router HA).
  for (int e : dispatcher_.hosted_experts()) load.add_hosted_expert_ids(e);
  return load;
}

}  // namespace moesh
