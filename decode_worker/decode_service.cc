#include "decode_worker/decode_service.h"

#include <condition_variable>
#include <mutex>

#include "base/cancel_token.h"
#include "common/rpc/grpc_util.h"
#include "common/service/serving_proto.h"

namespace moesh {
namespace {

// One Decode stream. Write blocks the request's thread until the message went
// out, as the sync API's did; the router cancelling (or its deadline) fires
// `cancel`. Deletes itself when gRPC is done with it, so Finish is the last
// thing its thread does with it.
class DecodeStream : public grpc::ServerWriteReactor<v1::DecodeResponse> {
 public:
  // False once the client is gone.
  bool Write(const v1::DecodeResponse& m) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!write_ok_) return false;
    writing_ = true;
    lock.unlock();
    StartWrite(&m);
    lock.lock();
    written_.wait(lock, [this] { return !writing_; });
    return write_ok_;
  }
  CancelToken& cancel() { return cancel_; }

 private:
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    write_ok_ = write_ok_ && ok;
    written_.notify_all();
  }
  void OnCancel() override { cancel_.Cancel(); }
  void OnDone() override { delete this; }

  CancelToken cancel_;
  std::mutex mu_;
  std::condition_variable written_;
  bool writing_ = false;
  bool write_ok_ = true;
};

}  // namespace

grpc::Status DecodeService::Reserve(grpc::ServerContext*, const v1::ReserveRequest* request,
                                    v1::ReserveResponse*) {
  return ToGrpcStatus(engine_->Reserve(request->request_id(), request->max_tokens()));
}

grpc::ServerWriteReactor<v1::DecodeResponse>* DecodeService::Decode(
    grpc::CallbackServerContext*, const v1::DecodeRequest* request) {
  auto* stream = new DecodeStream();
  pool_.Schedule([this, stream, request] {
    absl::Status s = engine_->Decode(
        DecodeSpecFromProto(*request),
        [stream](const TokenEvent& e) {
          v1::DecodeResponse m;
          TokenEventToProto(e, &m);
          // The client is gone: stop (the engine calls this with no lock held).
          if (!stream->Write(m)) stream->cancel().Cancel();
        },
        stream->cancel());
    stream->Finish(ToGrpcStatus(s));
  });
  return stream;
}

grpc::Status DecodeService::Release(grpc::ServerContext*, const v1::ReleaseRequest* request,
                                    v1::ReleaseResponse*) {
  return ToGrpcStatus(engine_->Release(request->request_id()));
}

}  // namespace moesh
