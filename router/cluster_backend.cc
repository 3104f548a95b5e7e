#include "router/cluster_backend.h"

#include <algorithm>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/engine/paged_kv_cache.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"
#include "router/worker_clients.h"

namespace moesh {
namespace {

// Loads as the picking ranks them. The registry only holds loads that passed
// ValidateHeartbeat (non-negative, kv_usage in [0, 1]); out-of-range values
// would still rank as the busiest, never the idlest, so no lie below zero
// (or a NaN, which would also break the sort's ordering) draws the traffic.
double KvUsageRank(const v1::WorkerLoad& l) {
  return l.kv_usage() >= 0.0f && l.kv_usage() <= 1.0f ? l.kv_usage() : 2.0;
}
int64_t RunningRank(const v1::WorkerLoad& l) {
  return l.num_running() >= 0 ? l.num_running() : std::numeric_limits<int64_t>::max();
}
int64_t QueuedRank(const v1::WorkerLoad& l) {
  return l.queued_prompt_tokens() >= 0 ? l.queued_prompt_tokens()
                                       : std::numeric_limits<int64_t>::max();
}

}  // namespace

int CachedPrefixTokens(const v1::WorkerLoad& load, absl::Span<const int32_t> prompt) {
  const int bs = load.cache_block_size();
  if (bs <= 0 || load.cached_block_hashes_size() == 0 || prompt.size() < 2) return 0;
  const absl::flat_hash_set<uint64_t> cached(load.cached_block_hashes().begin(),
                                             load.cached_block_hashes().end());
  const std::vector<uint64_t> hashes = PrefixBlockHashes(prompt.subspan(0, prompt.size() - 1), bs);
  int blocks = 0;
  while (blocks < static_cast<int>(hashes.size()) && cached.count(hashes[blocks])) ++blocks;
  return blocks * bs;
}

size_t PickPrefillWorker(absl::Span<const WorkerInfo> prefillers, absl::Span<const int32_t> prompt,
                         bool kv_aware) {
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());
  auto work = [&](const WorkerInfo& w) -> int64_t {
    const int64_t queued = QueuedRank(w.load);
    if (!kv_aware || queued == std::numeric_limits<int64_t>::max()) return queued;
    return queued + prompt_tokens - CachedPrefixTokens(w.load, prompt);
  };
  size_t pick = 0;
  int64_t least = work(prefillers[0]);
  for (size_t i = 1; i < prefillers.size(); ++i) {
    if (const int64_t w = work(prefillers[i]); w < least) least = w, pick = i;
  }
  return pick;
}

std::shared_ptr<grpc::Channel> ClusterBackend::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& ch = channels_[address];
  if (ch == nullptr) ch = CreateInternalChannel(address);
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
    const double ua = KvUsageRank(a.load), ub = KvUsageRank(b.load);
    if (ua != ub) return ua < ub;
    return RunningRank(a.load) < RunningRank(b.load);
  });
  const WorkerInfo& prefill =
      prefillers[PickPrefillWorker(prefillers, req.prompt, kv_aware_routing_)];
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
