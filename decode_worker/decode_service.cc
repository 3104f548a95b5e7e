#include "decode_worker/decode_service.h"

#include <memory>

#include "base/cancel_token.h"
#include "common/rpc/blocking_write_reactor.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"
#include "common/service/serving_proto.h"

namespace moesh {

grpc::ServerWriteReactor<v1::DecodeResponse>* DecodeService::Decode(
    grpc::CallbackServerContext* ctx, const v1::DecodeRequest* request) {
  // The router cancelling (or its deadline) fires `cancel`, which the engine waits on.
  auto cancel = std::make_shared<CancelToken>();
  auto* stream = new BlockingWriteReactor<v1::DecodeResponse>([cancel] { cancel->Cancel(); });
  if (absl::Status s = CheckAuthenticatedPeer(*ctx, "a decode reservation"); !s.ok()) {
    stream->Finish(ToGrpcStatus(s));
    return stream;
  }
  // Reservations awaiting their KV are capped per peer host, however many
  // connections it opens.
  pool_.Schedule([this, stream, request, cancel, caller = PeerHost(*ctx)] {
    absl::StatusOr<std::shared_ptr<DecodeEngine::Request>> reserved =
        engine_->Reserve(DecodeSpecFromProto(*request), cancel.get(), caller);
    if (!reserved.ok()) {
      stream->Finish(ToGrpcStatus(reserved.status()));
      return;
    }
    v1::DecodeResponse m;
    m.set_reserved(true);
    m.set_held_tokens(engine_->HeldTokens(**reserved));
    stream->Write(m);  // a client gone meanwhile has fired `cancel`: Decode ends at once
    absl::Status s = engine_->Decode(
        *reserved,
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

}  // namespace moesh
