#include "router/cluster_backend.h"

#include <algorithm>
#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_util.h"
#include "common/service/sampling_proto.h"

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

std::shared_ptr<grpc::Channel> ClusterBackend::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& ch = channels_[address];
  if (ch == nullptr)
    ch = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   InternalChannelArgs());
  return ch;
}

bool ClusterBackend::Ready() const {
  return !membership_->Live(v1::WORKER_KIND_PREFILL).empty() &&
         !membership_->Live(v1::WORKER_KIND_DECODE).empty();
}

absl::Status ClusterBackend::Run(const BackendRequest& req, const ChunkSink& sink,
                                 const std::function<bool()>& cancelled) {
  std::vector<WorkerInfo> decoders = membership_->Live(v1::WORKER_KIND_DECODE);
  std::vector<WorkerInfo> prefillers = membership_->Live(v1::WORKER_KIND_PREFILL);
  if (decoders.empty() || prefillers.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no ", decoders.empty() ? "decode" : "prefill", " worker is registered"));
  }
  std::sort(decoders.begin(), decoders.end(), [](const WorkerInfo& a, const WorkerInfo& b) {
    if (a.load.kv_usage() != b.load.kv_usage()) return a.load.kv_usage() < b.load.kv_usage();
    return a.load.num_running() < b.load.num_running();
  });
  const WorkerInfo& prefill =
      *std::min_element(prefillers.begin(), prefillers.end(), [](const auto& a, const auto& b) {
        return a.load.queued_prompt_tokens() < b.load.queued_prompt_tokens();
      });

  // Reserve KV on the first decode worker that has room.
  const WorkerInfo* decode = nullptr;
  std::unique_ptr<v1::DecodeWorker::Stub> decode_stub;
  absl::Status last = absl::ResourceExhaustedError("no decode worker has room");
  for (const WorkerInfo& d : decoders) {
    auto stub = v1::DecodeWorker::NewStub(ChannelTo(d.address));
    v1::ReserveRequest r;
    r.set_request_id(req.request_id);
    r.set_prompt_tokens(static_cast<int>(req.prompt.size()));
    r.set_max_tokens(static_cast<int>(req.prompt.size()) + req.max_new_tokens - 1);
    v1::ReserveResponse resp;
    grpc::Status s = stub->Reserve(Deadlined(kControlDeadline).get(), r, &resp);
    if (s.ok()) {
      decode = &d;
      decode_stub = std::move(stub);
      break;
    }
    last = WorkerFailed(d, s);
    if (s.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED &&
        s.error_code() != grpc::StatusCode::UNAVAILABLE) {
      return last;
    }
  }
  if (decode == nullptr) return last;
  auto release = [&] {
    v1::ReleaseRequest r;
    r.set_request_id(req.request_id);
    v1::ReleaseResponse resp;
    decode_stub->Release(Deadlined(kControlDeadline).get(), r, &resp);  // best effort
  };

  // Prefill; its KV goes straight into the reservation.
  v1::PrefillRequest pr;
  pr.set_request_id(req.request_id);
  pr.mutable_prompt_ids()->Add(req.prompt.begin(), req.prompt.end());
  SamplingToProto(req.sampling, pr.mutable_sampling());
  pr.set_decode_address(decode->data_plane_address);
  v1::PrefillResponse presp;
  {
    auto ctx = std::make_shared<grpc::ClientContext>();
    const int64_t h = membership_->Track(prefill.id, [ctx] { ctx->TryCancel(); });
    grpc::Status s =
        v1::PrefillWorker::NewStub(ChannelTo(prefill.address))->Prefill(ctx.get(), pr, &presp);
    membership_->Untrack(h);
    if (!s.ok()) {
      release();
      return WorkerFailed(prefill, s);
    }
  }
  TokenChunk first;
  first.queue_seconds = presp.queue_seconds();
  first.ids.push_back(presp.first_token());
  if (req.sampling.top_logprobs > 0) {
    std::vector<TokenLogprob> lp;
    for (const auto& c : presp.logprobs().candidates()) lp.push_back({c.id(), c.logprob()});
    first.logprobs.push_back(std::move(lp));
  }
  const bool first_stops = std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(),
                                     presp.first_token()) != req.stop_token_ids.end();
  if (!sink(first) || first_stops || req.max_new_tokens <= 1) {
    release();
    return absl::OkStatus();
  }

  // Decode: relay the stream; a dropped decode worker or a client that went
  // away cancels it.
  v1::DecodeRequest dr;
  dr.set_request_id(req.request_id);
  dr.mutable_prompt_ids()->Add(req.prompt.begin(), req.prompt.end());
  dr.set_first_token(presp.first_token());
  SamplingToProto(req.sampling, dr.mutable_sampling());
  dr.set_max_new_tokens(req.max_new_tokens);
  dr.mutable_stop_token_ids()->Add(req.stop_token_ids.begin(), req.stop_token_ids.end());
  auto ctx = std::make_shared<grpc::ClientContext>();
  const int64_t h = membership_->Track(decode->id, [ctx] { ctx->TryCancel(); });
  std::atomic<bool> finished{false}, by_client{false};
  std::thread watcher([&] {
    while (!finished.load()) {
      if (cancelled()) {
        by_client = true;
        ctx->TryCancel();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  auto reader = decode_stub->Decode(ctx.get(), dr);
  v1::DecodeResponse m;
  bool declined = false;
  while (!declined && reader->Read(&m)) {
    TokenChunk chunk;
    chunk.ids.assign(m.token_ids().begin(), m.token_ids().end());
    for (const auto& lp : m.logprobs()) {
      std::vector<TokenLogprob> v;
      for (const auto& c : lp.candidates()) v.push_back({c.id(), c.logprob()});
      chunk.logprobs.push_back(std::move(v));
    }
    if (!chunk.ids.empty() && !sink(chunk)) declined = true;
  }
  if (declined) ctx->TryCancel();
  grpc::Status s = reader->Finish();
  finished = true;
  watcher.join();
  membership_->Untrack(h);
  if (by_client) return absl::CancelledError("cancelled by the client");
  if (declined) return absl::OkStatus();
  if (!s.ok()) return WorkerFailed(*decode, s);
  return absl::OkStatus();
}

}  // namespace moesh
