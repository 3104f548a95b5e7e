#include "expert_worker/expert_service.h"

#include <vector>

#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"

namespace moesh {

ExpertService::ExpertService(std::unique_ptr<ExpertStage> stage, std::string fingerprint,
                             ExpertServiceOptions options)
    : dispatcher_(std::move(stage), std::move(options)), fingerprint_(std::move(fingerprint)) {}

absl::Status ExpertService::Dispatch(const MoeDispatch& dispatch, float* out) {
  return dispatcher_.Dispatch(dispatch, out);
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
  return load;
}

}  // namespace moesh
