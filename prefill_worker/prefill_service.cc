#include "prefill_worker/prefill_service.h"

#include "common/rpc/grpc_util.h"
#include "common/service/serving_proto.h"

namespace moesh {

grpc::Status PrefillService::Prefill(grpc::ServerContext*, const v1::PrefillRequest* request,
                                     v1::PrefillResponse* response) {
  absl::StatusOr<PrefillResult> r = engine_->Prefill(PrefillSpecFromProto(*request));
  if (!r.ok()) return ToGrpcStatus(r.status());
  PrefillResultToProto(*r, response);
  return grpc::Status::OK;
}

}  // namespace moesh
