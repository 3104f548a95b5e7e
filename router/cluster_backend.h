// Disaggregated serving: for each request the router orders the decode
// workers (lowest KV usage, then fewest running) and picks a prefill worker
// (fewest queued prompt tokens), then runs the request flow
// (common/serving/generation_flow.h) over their gRPC clients
// (router/worker_clients.h). Thread-safe.
#ifndef MOESH_ROUTER_CLUSTER_BACKEND_H_
#define MOESH_ROUTER_CLUSTER_BACKEND_H_

#include <map>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "moesh/v1/worker.grpc.pb.h"
#include "router/backend.h"
#include "router/membership.h"

namespace moesh {

// The prompt tokens a worker reporting `load` would take from its prefix
// cache: the leading blocks of `prompt` whose hashes (PrefixBlockHashes over
// load.cache_block_size) it reports, at most prompt.size() - 1 tokens (as a
// worker matches). 0 without a report.
int CachedPrefixTokens(const v1::WorkerLoad& load, absl::Span<const int32_t> prompt);

// The index in `prefillers` (not empty) of the prefill worker with the least
// work before `prompt`'s first token by the loads they reported: queued
// prompt tokens, plus with `kv_aware` the prompt tokens its prefix cache
// lacks (so a cached prefix draws the prompt unless that worker's queue is
// longer than what the cache saves). Ties go to the earliest in the list.
size_t PickPrefillWorker(absl::Span<const WorkerInfo> prefillers, absl::Span<const int32_t> prompt,
                         bool kv_aware);

class ClusterBackend : public GenerationBackend {
 public:
  // `membership` is borrowed and must outlive the backend.
  // kv_aware_routing: the prefill worker is the one with the least work
  // before this prompt's first token, its queued prompt tokens plus the
  // prompt tokens its prefix cache lacks (PrefillWork); else the one with
  // the fewest queued tokens.
  explicit ClusterBackend(Membership* membership, bool kv_aware_routing = true)
      : registry_(&membership->registry()), kv_aware_routing_(kv_aware_routing) {}

  absl::Status Run(const GenerationRequest& request, const ChunkSink& sink,
                   const CancelToken& cancel) override;
  bool Ready() const override;

 private:
  std::shared_ptr<grpc::Channel> ChannelTo(const std::string& address);

  WorkerRegistry* const registry_;
  const bool kv_aware_routing_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moesh

#endif  // MOESH_ROUTER_CLUSTER_BACKEND_H_
