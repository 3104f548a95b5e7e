// Disaggregated serving: for each request the router orders the decode
// workers and picks a prefill worker by its RoutingPolicy (by default the
// load they report and the prefixes their caches hold), then runs the request flow
// (common/serving/generation_flow.h) over their gRPC clients
// (router/worker_clients.h). Thread-safe.
//
// Streams survive a worker's death: when the decode worker streaming a
// request fails (killed: the stream breaks UNAVAILABLE), or the prefill
// before it does, the request is continued on another prefill/decode pair
// (the failed workers tried last) from where it stopped: prompt + the tokens
// already streamed are prefilled as the prompt, for the remaining
// max_new_tokens (ContinuationOf, which says what a sampled stream keeps),
// and the client's stream goes on without a token repeated or lost. At most
// max_migrations times per request, while its CancelToken (client gone,
// deadline, Abort) has not fired; then UNAVAILABLE saying what failed.
#ifndef MOESH_ROUTER_CLUSTER_BACKEND_H_
#define MOESH_ROUTER_CLUSTER_BACKEND_H_

#include <atomic>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/metrics/metrics.h"
#include "moesh/v1/worker.grpc.pb.h"
#include "router/backend.h"
#include "router/membership.h"
#include "router/routing_policy.h"

namespace moesh {

// A prompt's block hashes as a worker's prefix cache looks them up
// (PrefixBlockHashes over all but its last token: a worker matches at most
// prompt.size() - 1 tokens), computed once per block size however many
// workers' reports a routing decision checks. Borrows `prompt`; not
// thread-safe.
class PromptBlockHashes {
 public:
  explicit PromptBlockHashes(absl::Span<const int32_t> prompt) : prompt_(prompt) {}
  absl::Span<const int32_t> prompt() const { return prompt_; }
  // The hashes of the prompt's full blocks of `block_size` (> 0) tokens.
  const std::vector<uint64_t>& For(int block_size);
  // How many block sizes were hashed so far.
  int computed() const { return static_cast<int>(by_size_.size()); }

 private:
  const absl::Span<const int32_t> prompt_;
  std::vector<std::pair<int, std::vector<uint64_t>>> by_size_;
};

// The prompt tokens a worker reporting `load` would take from its prefix
// cache: the leading blocks of the prompt whose hashes (over
// load.cache_block_size) it reports, at most prompt.size() - 1 tokens (as a
// worker matches). 0 without a report.
int CachedPrefixTokens(const v1::WorkerLoad& load, PromptBlockHashes* prompt);

// The index in `prefillers` (not empty) of the prefill worker to take.
// kKvAware: the one with the least work before `prompt`'s first token by the
// loads they reported, its queued prompt tokens plus the prompt tokens its
// prefix cache lacks (so a cached prefix draws the prompt unless that
// worker's queue is longer than what the cache saves); kLoad: the fewest
// queued prompt tokens (ties go to the earliest in the list); kRoundRobin:
// `turn` modulo their number.
size_t PickPrefillWorker(absl::Span<const WorkerInfo> prefillers, PromptBlockHashes* prompt,
                         RoutingPolicy policy, uint64_t turn);

// How much more of its KV pool (a fraction, [0, 1]) a decode worker may have
// in use than the least used one and still draw a request by its cache.
inline constexpr double kKvAwareDecodeUsageSlack = 0.1;

// Orders `decoders` as they are to be tried for `prompt`. kLoad: the least
// KV usage first, then the fewest running. kKvAware: the same, except that
// the workers within kKvAwareDecodeUsageSlack of the least usage come first,
// the longest cached prefix of the prompt (CachedPrefixTokens) first among
// them: the decode worker then holds those rows already (the KV handoff
// brings only the rest) without drawing requests away from a much emptier
// pool. kRoundRobin: the list as given, rotated to start at `turn` modulo
// its size.
void OrderDecodeWorkers(std::vector<WorkerInfo>* decoders, PromptBlockHashes* prompt,
                        RoutingPolicy policy, uint64_t turn);

struct ClusterBackendOptions {
  // The prefill worker (PickPrefillWorker) and the decode workers' order
  // (OrderDecodeWorkers); round-robin turns count the requests run.
  RoutingPolicy routing = RoutingPolicy::kKvAware;
  // Continuations of one request on other workers after a failure (0: none).
  int max_migrations = 2;
  // A prompt with at most this many tokens not cached on a decode worker
  // that computes prompts (WorkerInfo::computes_prompts, CachedPrefixTokens)
  // is computed by such a worker itself (RunGeneration without a prefill
  // client), when one has room; 0: never.
  int max_local_prefill_tokens = 0;
  // May be null; else moesh_stream_migrations_total and
  // moesh_local_prefills_total.
  Metrics* metrics = nullptr;
};

class ClusterBackend : public GenerationBackend {
 public:
  // `membership` is borrowed and must outlive the backend.
  explicit ClusterBackend(Membership* membership, ClusterBackendOptions options = {});

  absl::Status Run(const GenerationRequest& request, const ChunkSink& sink,
                   const CancelToken& cancel) override;
  bool Ready() const override;

 private:
  // One run of `req` on the live workers, those in `avoid` (ids) tried last.
  // On a failure after a decode worker took it, *failed gets the ids of the
  // workers that may have caused it: the decode worker's once the prefill
  // succeeded (or when it computed the prompt itself), else the prefill
  // worker's and the decode worker's.
  absl::Status RunOnce(const GenerationRequest& req, const ChunkSink& sink,
                       const CancelToken& cancel, const std::vector<std::string>& avoid,
                       std::vector<std::string>* failed);
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);

  WorkerRegistry* const registry_;
  const ClusterBackendOptions options_;
  prometheus::Counter* migrations_ = nullptr;      // null without metrics
  prometheus::Counter* local_prefills_ = nullptr;  // null without metrics
  std::atomic<uint64_t> turn_{0};                  // kRoundRobin: the next request's turn
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moesh

#endif  // MOESH_ROUTER_CLUSTER_BACKEND_H_
