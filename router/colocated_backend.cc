#include "router/colocated_backend.h"

#include <atomic>

#include "absl/strings/str_cat.h"
#include "base/status.h"

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
  const bool chunked = decode_options.max_num_batched_tokens > 0;
  // One backend, one KV pool: a prefill engine's passes take blocks from it too.
  decode_options.prefill_shares_pool = !chunked;
  b->decode_ = std::make_unique<DecodeEngine>(b->worker_.backend.get(), b->worker_.experts.get(),
                                              decode_options);
  b->decode_client_ = std::make_unique<InProcessDecodeClient>(b->decode_.get(), b->inproc_address_);
  if (chunked) return b;  // the decode engine computes the prompts
  RETURN_IF_ERROR(BindInproc(b->inproc_address_, nullptr, b->decode_.get()));
  prefill_options.metrics = decode_options.metrics;
  prefill_options.prefix_cache_metrics = false;  // the decode engine exports the shared pool's
  // One GPU backend on both sides: the KV moves block to block in its own pool.
  if (b->worker_.backend->device() != "cpu") prefill_options.kv_handoff = KvHandoff::kDevice;
  b->prefill_ = std::make_unique<PrefillEngine>(b->worker_.backend.get(), b->worker_.experts.get(),
                                                b->worker_.kv_transport(), prefill_options);
  b->prefill_client_ = std::make_unique<InProcessPrefillClient>(b->prefill_.get());
  return b;
}

ColocatedBackend::~ColocatedBackend() {
  prefill_client_.reset();
  decode_client_.reset();
  if (prefill_ != nullptr) {
    prefill_.reset();
    UnbindInproc(inproc_address_);
  }
  decode_.reset();
}

absl::Status ColocatedBackend::Run(const GenerationRequest& req, const ChunkSink& sink,
                                   const CancelToken& cancel) {
  // Without a prefill engine (chunked), the decode engine computes the prompt.
  DecodeClient* const decoders[] = {decode_client_.get()};
  return RunGeneration(req, prefill_client_.get(), decoders, sink, cancel);
}

}  // namespace moesh
