#include "router/worker_clients.h"

#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/service/serving_proto.h"

namespace moesh {
namespace {

// A worker that died mid-call looks like CANCELLED (we cancelled it) or
// UNAVAILABLE (the connection broke); both mean UNAVAILABLE to the client,
// said in words a client can act on (the transport's own text, such as
// "recvmsg:Connection reset by peer", comes after).
absl::Status WorkerFailed(const WorkerInfo& w, const grpc::Status& s) {
  const bool gone = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                    s.error_code() == grpc::StatusCode::CANCELLED;
  const char* kind = w.kind == v1::WORKER_KIND_PREFILL ? "prefill" : "decode";
  if (gone) {
    return absl::UnavailableError(absl::StrCat("the ", kind, " worker ", w.id, " (", w.address,
                                               ") serving this request went away; retry (",
                                               s.error_message(), ")"));
  }
  return absl::Status(
      static_cast<absl::StatusCode>(s.error_code()),
      absl::StrCat(kind, " worker ", w.id, " (", w.address, "): ", s.error_message()));
}

}  // namespace

GrpcPrefillClient::GrpcPrefillClient(WorkerInfo worker, std::shared_ptr<grpc::Channel> channel,
                                     WorkerRegistry* registry)
    : worker_(std::move(worker)),
      stub_(v1::PrefillWorker::NewStub(std::move(channel))),
      registry_(registry) {}

absl::Status GrpcPrefillClient::Prefill(const PrefillSpec& spec, const CancelToken& cancel) {
  v1::PrefillRequest request;
  PrefillSpecToProto(spec, &request);
  v1::PrefillResponse response;
  auto ctx = std::make_shared<grpc::ClientContext>();
  const int64_t h = registry_->Track(worker_.id, [ctx] { ctx->TryCancel(); });
  // TryCancel before the call starts cancels it as it starts.
  CancelToken::Registration on_cancel = cancel.OnCancel([&ctx] { ctx->TryCancel(); });
  grpc::Status s = stub_->Prefill(ctx.get(), request, &response);
  on_cancel.Reset();
  registry_->Untrack(h);
  if (!s.ok() && cancel.cancelled()) return absl::CancelledError("cancelled by the client");
  if (!s.ok()) return WorkerFailed(worker_, s);
  return absl::OkStatus();
}

GrpcDecodeClient::GrpcDecodeClient(WorkerInfo worker, std::shared_ptr<grpc::Channel> channel,
                                   WorkerRegistry* registry)
    : worker_(std::move(worker)),
      stub_(v1::DecodeWorker::NewStub(std::move(channel))),
      registry_(registry) {}

namespace {

// A Decode stream past its {reserved} message. The registry and the caller's
// token cancel it (TryCancel) while it lives; going unrelayed, it cancels
// itself, which frees the reservation on the worker.
class GrpcDecodeStream : public DecodeStream {
 public:
  GrpcDecodeStream(const WorkerInfo* worker, WorkerRegistry* registry,
                   std::shared_ptr<grpc::ClientContext> ctx)
      : worker_(worker), registry_(registry), ctx_(std::move(ctx)) {}
  ~GrpcDecodeStream() override {
    if (reader_ != nullptr && !finished_) {
      ctx_->TryCancel();
      reader_->Finish().IgnoreError();
    }
    on_cancel_.Reset();
    registry_->Untrack(tracked_);
  }

  // Starts the call and reads its first message: OK once reserved, else the
  // worker's refusal (or CANCELLED by the caller).
  absl::Status Start(v1::DecodeWorker::Stub* stub, const v1::DecodeRequest& request,
                     const CancelToken& cancel) {
    std::shared_ptr<grpc::ClientContext> ctx = ctx_;
    tracked_ = registry_->Track(worker_->id, [ctx] { ctx->TryCancel(); });
    // TryCancel before the call starts cancels it as it starts.
    on_cancel_ = cancel.OnCancel([this] {
      by_caller_ = true;
      ctx_->TryCancel();
    });
    reader_ = stub->Decode(ctx_.get(), request);
    v1::DecodeResponse m;
    const bool read = reader_->Read(&m);
    if (read && m.reserved()) {
      held_tokens_ = m.held_tokens();
      return absl::OkStatus();
    }
    if (read) ctx_->TryCancel();
    absl::Status closed = Close(/*declined=*/read);  // refused, or gone
    if (!closed.ok() && !read) return closed;
    return absl::InternalError(absl::StrCat(worker_->id, " (", worker_->address,
                                            "): a Decode stream began without {reserved}"));
  }

  absl::Status Relay(const TokenSink& sink) override {
    v1::DecodeResponse m;
    bool declined = false;
    while (!declined && reader_->Read(&m)) {
      if (!sink(TokenEventFromProto(m))) declined = true;
    }
    if (declined) ctx_->TryCancel();
    return Close(declined);
  }
  int held_tokens() const override { return held_tokens_; }

 private:
  // Finishes the call: its status as the flow's.
  absl::Status Close(bool declined) {
    finished_ = true;
    grpc::Status s = reader_->Finish();
    if (by_caller_ && !s.ok()) return absl::CancelledError("cancelled by the client");
    if (declined) return absl::OkStatus();
    if (!s.ok()) return WorkerFailed(*worker_, s);
    return absl::OkStatus();
  }

  const WorkerInfo* const worker_;
  WorkerRegistry* const registry_;
  const std::shared_ptr<grpc::ClientContext> ctx_;
  int64_t tracked_ = 0;
  CancelToken::Registration on_cancel_;
  std::atomic<bool> by_caller_{false};
  std::unique_ptr<grpc::ClientReader<v1::DecodeResponse>> reader_;
  bool finished_ = false;
  int held_tokens_ = 0;  // the {reserved} message's (RunGeneration clamps it)
};

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeStream>> GrpcDecodeClient::Open(const DecodeSpec& spec,
                                                                     const CancelToken& cancel) {
  v1::DecodeRequest request;
  DecodeSpecToProto(spec, &request);
  auto stream = std::make_unique<GrpcDecodeStream>(&worker_, registry_,
                                                   std::make_shared<grpc::ClientContext>());
  if (absl::Status s = stream->Start(stub_.get(), request, cancel); !s.ok()) return s;
  return stream;
}

}  // namespace moesh
