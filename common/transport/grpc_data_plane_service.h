// The server side of the grpc transport: the DataPlane gRPC service, handing
// messages to a service's handlers. A null handler answers UNIMPLEMENTED.
#ifndef MOESH_COMMON_TRANSPORT_GRPC_DATA_PLANE_SERVICE_H_
#define MOESH_COMMON_TRANSPORT_GRPC_DATA_PLANE_SERVICE_H_

#include "common/transport/transport.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

class GrpcDataPlaneService final : public v1::DataPlane::Service {
 public:
  // Handlers may be null; they must outlive the service.
  GrpcDataPlaneService(DispatchHandler* dispatch, KvHandler* kv) : dispatch_(dispatch), kv_(kv) {}

  grpc::Status Dispatch(grpc::ServerContext* ctx, const v1::DispatchRequest* request,
                        v1::DispatchResponse* response) override;
  grpc::Status PushKv(grpc::ServerContext* ctx, const v1::PushKvRequest* request,
                      v1::PushKvResponse* response) override;

 private:
  DispatchHandler* const dispatch_;
  KvHandler* const kv_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_GRPC_DATA_PLANE_SERVICE_H_
