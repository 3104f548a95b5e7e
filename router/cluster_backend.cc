#include "router/cluster_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_util.h"
#include "router/worker_clients.h"

namespace moesh {

std::shared_ptr<grpc::Channel> ClusterBackend::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& ch = channels_[address];
  if (ch == nullptr)
    ch = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                   InternalChannelArgs());
  return ch;
}

bool ClusterBackend::Ready() const {
  return !registry_->Live(v1::WORKER_KIND_PREFILL).empty() &&
         !registry_->Live(v1::WORKER_KIND_DECODE).empty();
}

absl::Status ClusterBackend::Run(const GenerationRequest& req, const ChunkSink& sink,
                                 const CancelToken& cancel) {
  std::vector<WorkerInfo> decoders = registry_->Live(v1::WORKER_KIND_DECODE);
  std::vector<WorkerInfo> prefillers = registry_->Live(v1::WORKER_KIND_PREFILL);
  if (decoders.empty() || prefillers.empty()) {
    return absl::UnavailableError(
        absl::StrCat("no ", decoders.empty() ? "decode" : "prefill", " worker is registered"));
  }
  // Decode workers in the order to try: lowest KV usage, then fewest running.
  std::sort(decoders.begin(), decoders.end(), [](const WorkerInfo& a, const WorkerInfo& b) {
    if (a.load.kv_usage() != b.load.kv_usage()) return a.load.kv_usage() < b.load.kv_usage();
    return a.load.num_running() < b.load.num_running();
  });
  // The prefill worker with the fewest queued prompt tokens.
  const WorkerInfo& prefill =
      *std::min_element(prefillers.begin(), prefillers.end(), [](const auto& a, const auto& b) {
        return a.load.queued_prompt_tokens() < b.load.queued_prompt_tokens();
      });
  GrpcPrefillClient prefill_client(prefill, ChannelTo(prefill.address), registry_);
  std::vector<std::unique_ptr<GrpcDecodeClient>> decode_clients;
  std::vector<DecodeClient*> order;
  for (const WorkerInfo& d : decoders) {
    decode_clients.push_back(
        std::make_unique<GrpcDecodeClient>(d, ChannelTo(d.address), registry_));
    order.push_back(decode_clients.back().get());
  }
  return RunGeneration(req, prefill_client, order, sink, cancel);
}

}  // namespace moesh
