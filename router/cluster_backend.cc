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

const std::vector<uint64_t>& PromptBlockHashes::For(int block_size) {
  for (const auto& [size, hashes] : by_size_) {
    if (size == block_size) return hashes;
  }
  const absl::Span<const int32_t> matched =
      prompt_.subspan(0, prompt_.empty() ? 0 : prompt_.size() - 1);
  by_size_.emplace_back(block_size, PrefixBlockHashes(matched, block_size));
  return by_size_.back().second;
}

int CachedPrefixTokens(const v1::WorkerLoad& load, PromptBlockHashes* prompt) {
  const int bs = load.cache_block_size();
  if (bs <= 0 || load.cached_block_hashes_size() == 0 || prompt->prompt().size() < 2) return 0;
  const absl::flat_hash_set<uint64_t> cached(load.cached_block_hashes().begin(),
                                             load.cached_block_hashes().end());
  const std::vector<uint64_t>& hashes = prompt->For(bs);
  int blocks = 0;
  while (blocks < static_cast<int>(hashes.size()) && cached.count(hashes[blocks])) ++blocks;
  return blocks * bs;
}

size_t PickPrefillWorker(absl::Span<const WorkerInfo> prefillers, PromptBlockHashes* prompt,
                         RoutingPolicy policy, uint64_t turn) {
  if (policy == RoutingPolicy::kRoundRobin) return turn % prefillers.size();
  const bool kv_aware = policy == RoutingPolicy::kKvAware;
  const int64_t prompt_tokens = static_cast<int64_t>(prompt->prompt().size());
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

void OrderDecodeWorkers(std::vector<WorkerInfo>* decoders, PromptBlockHashes* prompt,
                        RoutingPolicy policy, uint64_t turn) {
  if (policy == RoutingPolicy::kRoundRobin) {
    if (!decoders->empty()) {
      std::rotate(decoders->begin(), decoders->begin() + turn % decoders->size(), decoders->end());
    }
    return;
  }
  auto by_load = [](const WorkerInfo& a, const WorkerInfo& b) {
    const double ua = KvUsageRank(a.load), ub = KvUsageRank(b.load);
    if (ua != ub) return ua < ub;
    return RunningRank(a.load) < RunningRank(b.load);
  };
  std::sort(decoders->begin(), decoders->end(), by_load);
  if (policy != RoutingPolicy::kKvAware || decoders->empty()) return;
  const double least = KvUsageRank(decoders->front().load);
  const auto near = std::partition_point(
      decoders->begin(), decoders->end(),
      [&](const WorkerInfo& w) { return KvUsageRank(w.load) <= least + kKvAwareDecodeUsageSlack; });
  std::vector<int> cached;
  for (auto it = decoders->begin(); it != near; ++it)
    cached.push_back(CachedPrefixTokens(it->load, prompt));
  std::vector<size_t> order(cached.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return cached[a] > cached[b]; });
  std::vector<WorkerInfo> front;
  for (size_t i : order) front.push_back((*decoders)[i]);
  std::copy(front.begin(), front.end(), decoders->begin());
}

std::shared_ptr<grpc::Channel> ClusterBackend::ChannelTo(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& ch = channels_[address];
  if (ch == nullptr) ch = CreateInternalChannel(address);
  return ch;
}

ClusterBackend::ClusterBackend(Membership* membership, ClusterBackendOptions options)
    : registry_(&membership->registry()), options_(options) {
  if (options_.metrics != nullptr) {
    migrations_ = &options_.metrics
                       ->CounterFamily("moesh_stream_migrations_total",
                                       "Streams continued on another prefill/decode pair after "
                                       "a worker serving them failed.")
                       .Add({});
    local_prefills_ = &options_.metrics
                           ->CounterFamily("moesh_local_prefills_total",
                                           "Prompts a decode worker computed itself instead of "
                                           "a prefill worker (--max_local_prefill_tokens).")
                           .Add({});
  }
}

bool ClusterBackend::Ready() const {
  return !registry_->Live(v1::WORKER_KIND_PREFILL).empty() &&
         !registry_->Live(v1::WORKER_KIND_DECODE).empty();
}

absl::Status ClusterBackend::RunOnce(const GenerationRequest& req, const ChunkSink& sink,
                                     const CancelToken& cancel,
                                     const std::vector<std::string>& avoid,
                                     std::vector<std::string>* failed) {
  std::vector<WorkerInfo> decoders = registry_->Live(v1::WORKER_KIND_DECODE);
  if (decoders.empty()) return absl::UnavailableError("no decode worker is registered");
  auto avoided = [&](const WorkerInfo& w) {
    return std::find(avoid.begin(), avoid.end(), w.id) != avoid.end();
  };
  // Decode workers in the order to try (OrderDecodeWorkers); those that
  // failed this request last. The prompt is hashed once for both choices.
  PromptBlockHashes hashes(req.prompt);
  const uint64_t turn = turn_.fetch_add(1, std::memory_order_relaxed);
  OrderDecodeWorkers(&decoders, &hashes, options_.routing, turn);
  std::stable_partition(decoders.begin(), decoders.end(),
                        [&](const WorkerInfo& w) { return !avoided(w); });
  // RunGeneration over the decode workers `ds` (in order), prefilling on
  // `prefill` (null: the decode worker computes the prompt); the workers
  // that may have caused a failure go to *failed.
  GenerationOutcome outcome;
  auto run = [&](PrefillClient* prefill, const std::vector<WorkerInfo>& ds) {
    std::vector<std::unique_ptr<GrpcDecodeClient>> clients;
    std::vector<DecodeClient*> order;
    for (const WorkerInfo& d : ds) {
      clients.push_back(std::make_unique<GrpcDecodeClient>(d, ChannelTo(d.address), registry_));
      order.push_back(clients.back().get());
    }
    absl::Status s = RunGeneration(req, prefill, order, sink, cancel, &outcome);
    failed->clear();
    if (!s.ok() && outcome.decoder >= 0) failed->push_back(ds[outcome.decoder].id);
    return s;
  };
  // Conditional disaggregation: the decode workers that would compute the
  // prompt themselves, those that can (computes_prompts) and lack at most
  // max_local_prefill_tokens of it (all of it where its log-probabilities are
  // asked: those read no cached rows). If none of them takes it (full, or
  // gone), a prefill worker computes it for any.
  std::vector<WorkerInfo> locals;
  const int n = static_cast<int>(req.prompt.size());
  const bool all_positions = req.sampling.prompt_logprobs >= 0;
  for (const WorkerInfo& d : decoders) {
    if (options_.max_local_prefill_tokens <= 0 || !d.computes_prompts) continue;  // off, or can't
    const int cached = all_positions ? 0 : CachedPrefixTokens(d.load, &hashes);
    if (n - cached <= options_.max_local_prefill_tokens) locals.push_back(d);
  }
  absl::Status local = absl::UnavailableError("no prefill worker is registered");
  if (!locals.empty()) {
    absl::Status s = run(nullptr, locals);
    const bool taken = outcome.decoder >= 0;
    if (taken && local_prefills_ != nullptr) local_prefills_->Increment();
    if (taken || cancel.cancelled() ||
        (s.code() != absl::StatusCode::kResourceExhausted &&
         s.code() != absl::StatusCode::kUnavailable)) {
      return s;
    }
    local = s;  // what the client hears if no prefill worker can take it either
  }
  std::vector<WorkerInfo> prefillers = registry_->Live(v1::WORKER_KIND_PREFILL);
  if (prefillers.empty()) return local;
  // The prefill worker among those that did not fail it, if any is left.
  const auto fresh = std::stable_partition(prefillers.begin(), prefillers.end(),
                                           [&](const WorkerInfo& w) { return !avoided(w); });
  if (fresh != prefillers.begin()) prefillers.erase(fresh, prefillers.end());
  const WorkerInfo& prefill =
      prefillers[PickPrefillWorker(prefillers, &hashes, options_.routing, turn)];
  GrpcPrefillClient prefill_client(prefill, ChannelTo(prefill.address), registry_);
  absl::Status s = run(&prefill_client, decoders);
  if (!s.ok() && outcome.decoder >= 0 && !outcome.prefilled) failed->push_back(prefill.id);
  return s;
}

absl::Status ClusterBackend::Run(const GenerationRequest& req, const ChunkSink& sink,
                                 const CancelToken& cancel) {
  std::vector<int32_t> generated;  // what reached `sink`, across migrations
  const ChunkSink counted = [&](const TokenChunk& chunk) {
    generated.insert(generated.end(), chunk.ids.begin(), chunk.ids.end());
    return sink(chunk);
  };
  std::vector<std::string> avoid;  // the workers that failed this request
  absl::Status first_failure;
  for (int migrations = 0;; ++migrations) {
    std::vector<std::string> failed;
    absl::Status s = RunOnce(ContinuationOf(req, generated), counted, cancel, avoid, &failed);
    if (s.ok() || cancel.cancelled()) return s;
    // A worker that died after streaming the last token ended nothing.
    if (!failed.empty() && GenerationDone(req, generated)) return absl::OkStatus();
    // Only a worker that went away mid-request is worth another try: any
    // other error (a refusal, no room anywhere) would come back the same.
    const bool worker_failed = s.code() == absl::StatusCode::kUnavailable && !failed.empty();
    if (!worker_failed || migrations == options_.max_migrations) {
      if (migrations == 0) return s;
      return absl::UnavailableError(
          absl::StrCat("a worker serving this stream failed after ", generated.size(), " of ",
                       req.max_new_tokens, " tokens and continuing it elsewhere failed (",
                       migrations, migrations == 1 ? " try" : " tries",
                       "); retry. Last: ", s.message(), ". First: ", first_failure.message()));
    }
    if (migrations == 0) first_failure = s;
    avoid.insert(avoid.end(), failed.begin(), failed.end());
    if (migrations_ != nullptr) migrations_->Increment();
  }
}

}  // namespace moesh
