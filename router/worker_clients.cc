#include "router/worker_clients.h"

#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/service/serving_proto.h"

namespace moesh {
namespace {

constexpr auto kControlDeadline = std::chrono::seconds(10);

std::unique_ptr<grpc::ClientContext> Deadlined(std::chrono::seconds d) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + d);
  return ctx;
}

// A worker that died mid-call looks like CANCELLED (we cancelled it) or
// UNAVAILABLE (the connection broke); both mean UNAVAILABLE to the client.
absl::Status WorkerFailed(const WorkerInfo& w, const grpc::Status& s) {
  const bool gone = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                    s.error_code() == grpc::StatusCode::CANCELLED;
  return absl::Status(
      gone ? absl::StatusCode::kUnavailable : static_cast<absl::StatusCode>(s.error_code()),
      absl::StrCat(w.id, " (", w.address, "): ", s.error_message()));
}

}  // namespace

GrpcPrefillClient::GrpcPrefillClient(WorkerInfo worker, std::shared_ptr<grpc::Channel> channel,
                                     WorkerRegistry* registry)
    : worker_(std::move(worker)),
      stub_(v1::PrefillWorker::NewStub(std::move(channel))),
      registry_(registry) {}

absl::StatusOr<PrefillResult> GrpcPrefillClient::Prefill(const PrefillSpec& spec,
                                                         const CancelToken& cancel) {
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
  return PrefillResultFromProto(response);
}

GrpcDecodeClient::GrpcDecodeClient(WorkerInfo worker, std::shared_ptr<grpc::Channel> channel,
                                   WorkerRegistry* registry)
    : worker_(std::move(worker)),
      stub_(v1::DecodeWorker::NewStub(std::move(channel))),
      registry_(registry) {}

absl::Status GrpcDecodeClient::Reserve(const std::string& request_id, int prompt_tokens,
                                       int max_tokens) {
  v1::ReserveRequest r;
  r.set_request_id(request_id);
  r.set_prompt_tokens(prompt_tokens);
  r.set_max_tokens(max_tokens);
  v1::ReserveResponse resp;
  grpc::Status s = stub_->Reserve(Deadlined(kControlDeadline).get(), r, &resp);
  return s.ok() ? absl::OkStatus() : WorkerFailed(worker_, s);
}

void GrpcDecodeClient::Release(const std::string& request_id) {
  v1::ReleaseRequest r;
  r.set_request_id(request_id);
  v1::ReleaseResponse resp;
  stub_->Release(Deadlined(kControlDeadline).get(), r, &resp);  // best effort: the lease frees it
}

absl::Status GrpcDecodeClient::Decode(const DecodeSpec& spec, const TokenSink& sink,
                                      const CancelToken& cancel) {
  v1::DecodeRequest request;
  DecodeSpecToProto(spec, &request);
  auto ctx = std::make_shared<grpc::ClientContext>();
  const int64_t h = registry_->Track(worker_.id, [ctx] { ctx->TryCancel(); });
  // The stream's reads block; the caller's cancellation cancels the stream
  // as it happens (the worker then frees the request's blocks).
  std::atomic<bool> by_caller{false};
  CancelToken::Registration on_cancel = cancel.OnCancel([&] {
    by_caller = true;
    ctx->TryCancel();
  });
  auto reader = stub_->Decode(ctx.get(), request);
  v1::DecodeResponse m;
  bool declined = false;
  while (!declined && reader->Read(&m)) {
    if (!sink(TokenEventFromProto(m))) declined = true;
  }
  if (declined) ctx->TryCancel();
  grpc::Status s = reader->Finish();
  on_cancel.Reset();
  registry_->Untrack(h);
  if (by_caller && !s.ok()) return absl::CancelledError("cancelled by the client");
  if (declined) return absl::OkStatus();
  if (!s.ok()) return WorkerFailed(worker_, s);
  return absl::OkStatus();
}

}  // namespace moesh
