#include "decode_worker/decode_service.h"

#include "common/rpc/grpc_util.h"
#include "common/service/serving_proto.h"

namespace moesh {

grpc::Status DecodeService::Reserve(grpc::ServerContext*, const v1::ReserveRequest* request,
                                    v1::ReserveResponse*) {
  return ToGrpcStatus(engine_->Reserve(request->request_id(), request->max_tokens()));
}

grpc::Status DecodeService::Decode(grpc::ServerContext* ctx, const v1::DecodeRequest* request,
                                   grpc::ServerWriter<v1::DecodeResponse>* writer) {
  bool client_gone = false;
  absl::Status s = engine_->Decode(
      DecodeSpecFromProto(*request),
      [&](const TokenEvent& e) {
        v1::DecodeResponse m;
        TokenEventToProto(e, &m);
        client_gone = client_gone || !writer->Write(m);
      },
      [&] { return client_gone || ctx->IsCancelled(); });
  return ToGrpcStatus(s);
}

grpc::Status DecodeService::Release(grpc::ServerContext*, const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse*) {
  return ToGrpcStatus(engine_->Release(request->request_id()));
}

}  // namespace moesh
