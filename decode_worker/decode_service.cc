#include "decode_worker/decode_service.h"

#include <memory>

#include "base/cancel_token.h"
#include "common/rpc/blocking_write_reactor.h"
#include "common/rpc/grpc_util.h"
#include "common/service/serving_proto.h"

namespace moesh {
grpc::Status DecodeService::Reserve(grpc::ServerContext*, const v1::ReserveRequest* request,
                                    v1::ReserveResponse*) {
  return ToGrpcStatus(engine_->Reserve(request->request_id(), request->max_tokens()));
}

grpc::ServerWriteReactor<v1::DecodeResponse>* DecodeService::Decode(
    grpc::CallbackServerContext*, const v1::DecodeRequest* request) {
  // The router cancelling (or its deadline) fires `cancel`, which the engine waits on.
  auto cancel = std::make_shared<CancelToken>();
  auto* stream = new BlockingWriteReactor<v1::DecodeResponse>([cancel] { cancel->Cancel(); });
  pool_.Schedule([this, stream, request, cancel] {
    absl::Status s = engine_->Decode(
        DecodeSpecFromProto(*request),
        [stream, cancel](const TokenEvent& e) {
          v1::DecodeResponse m;
          TokenEventToProto(e, &m);
          // The client is gone: stop (the engine calls this with no lock held).
          if (!stream->Write(m)) cancel->Cancel();
        },
        *cancel);
    stream->Finish(ToGrpcStatus(s));
  });
  return stream;
}

grpc::Status DecodeService::Release(grpc::ServerContext*, const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse*) {
  return ToGrpcStatus(engine_->Release(request->request_id()));
}

}  // namespace moesh
