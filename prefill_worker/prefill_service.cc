#include "prefill_worker/prefill_service.h"

#include "common/rpc/grpc_util.h"
#include "common/service/sampling_proto.h"

namespace moesh {

grpc::Status PrefillService::Prefill(grpc::ServerContext*, const v1::PrefillRequest* request,
                                     v1::PrefillResponse* response) {
  PrefillSpec spec;
  spec.request_id = request->request_id();
  spec.prompt_ids.assign(request->prompt_ids().begin(), request->prompt_ids().end());
  spec.sampling = SamplingFromProto(request->sampling());
  spec.decode_address = request->decode_address();
  absl::StatusOr<PrefillResult> r = engine_->Prefill(spec);
  if (!r.ok()) return ToGrpcStatus(r.status());
  response->set_first_token(r->first_token);
  response->set_queue_seconds(r->queue_seconds);
  for (const TokenLogprob& t : r->logprobs) {
    v1::TokenLogprob* c = response->mutable_logprobs()->add_candidates();
    c->set_id(t.id);
    c->set_logprob(t.logprob);
  }
  return grpc::Status::OK;
}

}  // namespace moesh
