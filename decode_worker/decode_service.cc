#include "decode_worker/decode_service.h"

#include "common/rpc/grpc_util.h"
#include "common/service/sampling_proto.h"

namespace moesh {

grpc::Status DecodeService::Reserve(grpc::ServerContext*, const v1::ReserveRequest* request,
                                    v1::ReserveResponse*) {
  return ToGrpcStatus(engine_->Reserve(request->request_id(), request->max_tokens()));
}

grpc::Status DecodeService::Decode(grpc::ServerContext* ctx, const v1::DecodeRequest* request,
                                   grpc::ServerWriter<v1::DecodeResponse>* writer) {
  DecodeSpec spec;
  spec.request_id = request->request_id();
  spec.prompt_ids.assign(request->prompt_ids().begin(), request->prompt_ids().end());
  spec.first_token = request->first_token();
  spec.sampling = SamplingFromProto(request->sampling());
  spec.max_new_tokens = request->max_new_tokens();
  spec.stop_token_ids.assign(request->stop_token_ids().begin(), request->stop_token_ids().end());
  bool client_gone = false;
  absl::Status s = engine_->Decode(
      spec, [&](const v1::DecodeResponse& m) { client_gone = client_gone || !writer->Write(m); },
      [&] { return client_gone || ctx->IsCancelled(); });
  return ToGrpcStatus(s);
}

grpc::Status DecodeService::Release(grpc::ServerContext*, const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse*) {
  return ToGrpcStatus(engine_->Release(request->request_id()));
}

}  // namespace moesh
