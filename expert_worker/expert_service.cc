#include "expert_worker/expert_service.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_util.h"

namespace moesh {

ExpertService::ExpertService(std::unique_ptr<ExpertStage> stage, std::string fingerprint,
                             ExpertServiceOptions options)
    : dispatcher_(std::move(stage), std::move(options)), fingerprint_(std::move(fingerprint)) {}

absl::Status ExpertService::Dispatch(const v1::DispatchRequest& r, v1::DispatchResponse* response) {
  const int64_t n = r.num_tokens();
  if (n < 0 || r.top_k() <= 0 || r.hidden() <= 0)
    return absl::InvalidArgumentError("dispatch with bad dimensions");
  if (r.hidden_states().size() != static_cast<size_t>(n) * r.hidden() * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("dispatch hidden_states holds ",
                                                   r.hidden_states().size(), " bytes, expected ",
                                                   n * r.hidden() * 4));
  }
  if (r.topk_ids_size() != n * r.top_k() || r.topk_weights_size() != n * r.top_k()) {
    return absl::InvalidArgumentError(
        "dispatch topk_ids/topk_weights do not match num_tokens * top_k");
  }
  MoeDispatch d;
  d.layer = r.layer();
  d.num_tokens = r.num_tokens();
  d.hidden = r.hidden();
  d.top_k = r.top_k();
  d.hidden_states = reinterpret_cast<const float*>(r.hidden_states().data());
  d.topk_ids = r.topk_ids().data();
  d.topk_weights = r.topk_weights().data();
  std::vector<float> out(static_cast<size_t>(n) * r.hidden());
  if (absl::Status s = dispatcher_.Dispatch(d, out.data()); !s.ok()) return s;
  response->mutable_output()->assign(reinterpret_cast<const char*>(out.data()),
                                     out.size() * sizeof(float));
  return absl::OkStatus();
}

absl::Status ExpertService::DispatchOnDevice(const DeviceMoeDispatch& dispatch, float* out) {
  return dispatcher_.DispatchOnDevice(dispatch, out);
}

grpc::Status ExpertService::Info(grpc::ServerContext*, const v1::ExpertInfoRequest*,
                                 v1::ExpertInfoResponse* response) {
  for (int e : dispatcher_.hosted_experts()) response->add_expert_ids(e);
  response->set_model_fingerprint(fingerprint_);
  response->set_data_plane_address(data_plane_address_);
  return grpc::Status::OK;
}

grpc::Status ExpertService::LoadExperts(grpc::ServerContext*, const v1::LoadExpertsRequest* request,
                                        v1::LoadExpertsResponse* response) {
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
