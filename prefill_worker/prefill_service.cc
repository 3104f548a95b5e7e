#include "prefill_worker/prefill_service.h"

#include "base/cancel_token.h"
#include "common/rpc/grpc_util.h"
#include "common/service/serving_proto.h"

namespace moesh {
namespace {

// One Prefill call: the router cancelling it fires `cancel`. Deletes itself
// when gRPC is done with it, so Finish is the last thing its thread does.
class PrefillCall : public grpc::ServerUnaryReactor {
 public:
  const CancelToken& cancel() const { return cancel_; }

 private:
  void OnCancel() override { cancel_.Cancel(); }
  void OnDone() override { delete this; }

  CancelToken cancel_;
};

}  // namespace

grpc::ServerUnaryReactor* PrefillService::Prefill(grpc::CallbackServerContext*,
                                                  const v1::PrefillRequest* request,
                                                  v1::PrefillResponse*) {
  auto* call = new PrefillCall();
  pool_.Schedule([this, call, request] {
    call->Finish(ToGrpcStatus(engine_->Prefill(PrefillSpecFromProto(*request), &call->cancel())));
  });
  return call;
}

}  // namespace moesh
