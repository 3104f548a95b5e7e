#include "router/colocated_backend.h"

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace moesh {

absl::StatusOr<std::unique_ptr<ColocatedBackend>> ColocatedBackend::Create(
    const std::string& model_dir, const DeviceOptions& device, DecodeEngineOptions decode_options,
    PrefillEngineOptions prefill_options) {
  AttentionWorkerOptions opt;
  opt.model_dir = model_dir;
  opt.transport = "inproc";
  opt.device = device;
  ASSIGN_OR_RETURN(AttentionWorker w, SetUpAttentionWorker(opt));
  std::unique_ptr<ColocatedBackend> b(new ColocatedBackend(std::move(w)));
  static std::atomic<int> instances{0};
  b->inproc_address_ = absl::StrCat("colocated-decode-", ++instances);
  b->decode_ = std::make_unique<DecodeEngine>(b->worker_.backend.get(), b->worker_.experts.get(),
                                              decode_options);
  RETURN_IF_ERROR(BindInproc(b->inproc_address_, nullptr, b->decode_.get()));
  prefill_options.metrics = decode_options.metrics;
  // One GPU backend on both sides: the KV moves block to block in its own pool.
  if (b->worker_.backend->device() != "cpu") prefill_options.kv_handoff = KvHandoff::kDevice;
  b->prefill_ = std::make_unique<PrefillEngine>(b->worker_.backend.get(), b->worker_.experts.get(),
                                                b->worker_.kv_transport(), prefill_options);
  return b;
}

ColocatedBackend::~ColocatedBackend() {
  prefill_.reset();
  UnbindInproc(inproc_address_);
  decode_.reset();
}

absl::Status ColocatedBackend::Run(const BackendRequest& req, const ChunkSink& sink,
                                   const std::function<bool()>& cancelled) {
  RETURN_IF_ERROR(decode_->Reserve(req.request_id,
                                   static_cast<int>(req.prompt.size()) + req.max_new_tokens - 1));
  PrefillSpec ps;
  ps.request_id = req.request_id;
  ps.prompt_ids = req.prompt;
  ps.sampling = req.sampling;
  ps.decode_address = inproc_address_;
  absl::StatusOr<PrefillResult> first = prefill_->Prefill(ps);
  if (!first.ok()) {
    decode_->Release(req.request_id).IgnoreError();
    return first.status();
  }
  TokenChunk chunk;
  chunk.queue_seconds = first->queue_seconds;
  chunk.ids.push_back(first->first_token);
  if (req.sampling.top_logprobs > 0) chunk.logprobs.push_back(first->logprobs);
  const bool stops = std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(),
                               first->first_token) != req.stop_token_ids.end();
  if (!sink(chunk) || stops || req.max_new_tokens <= 1) {
    decode_->Release(req.request_id).IgnoreError();
    return absl::OkStatus();
  }
  DecodeSpec ds;
  ds.request_id = req.request_id;
  ds.prompt_ids = req.prompt;
  ds.first_token = first->first_token;
  ds.sampling = req.sampling;
  ds.max_new_tokens = req.max_new_tokens;
  ds.stop_token_ids = req.stop_token_ids;
  bool declined = false;
  absl::Status s = decode_->Decode(
      ds,
      [&](const v1::DecodeResponse& m) {
        if (declined || m.token_ids().empty()) return;
        TokenChunk c;
        c.ids.assign(m.token_ids().begin(), m.token_ids().end());
        for (const auto& lp : m.logprobs()) {
          std::vector<TokenLogprob> v;
          for (const auto& x : lp.candidates()) v.push_back({x.id(), x.logprob()});
          c.logprobs.push_back(std::move(v));
        }
        if (!sink(c)) declined = true;
      },
      [&] { return declined || cancelled(); });
  if (declined && s.code() == absl::StatusCode::kCancelled) return absl::OkStatus();
  return s;
}

}  // namespace moesh
