#include "common/transport/grpc_data_plane_service.h"

#include "common/rpc/grpc_util.h"
#include "common/transport/dispatch_wire.h"
#include "common/transport/kv_wire.h"

namespace moesh {

grpc::Status GrpcDataPlaneService::Dispatch(grpc::ServerContext*,
                                            const v1::DispatchRequest* request,
                                            v1::DispatchResponse* response) {
  if (dispatch_ == nullptr)
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this worker hosts no experts");
  return ToGrpcStatus(ServeDispatch(*dispatch_, *request, response));
}

grpc::Status GrpcDataPlaneService::PushKv(grpc::ServerContext*, const v1::PushKvRequest* request,
                                          v1::PushKvResponse*) {
  if (kv_ == nullptr)
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this worker takes no KV");
  return ToGrpcStatus(ServePushKv(*kv_, *request));
}

}  // namespace moesh
