// Expert placement balancing (EPLB) for the router: from the token counts the
// expert workers report, replicates the hottest experts (router/eplb.h), has
// the workers load the new replicas while serving, switches the registry's
// placement map to the plan, and — once every attention worker routes by it
// — has the workers drop the replicas the map no longer uses. On demand
// (Run), or every `policy.interval` when the load is skewed beyond
// `policy.min_ratio`.
//
// Thread-safe; one rebalance at a time. Owns a thread when automatic.
#ifndef MOESH_ROUTER_REBALANCER_H_
#define MOESH_ROUTER_REBALANCER_H_

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/metrics/metrics.h"
#include "router/worker_registry.h"

namespace moesh {

struct RebalancePolicy {
  std::chrono::seconds interval{0};  // 0: only on request (Cluster.Rebalance)
  double min_ratio = 1.25;           // rebalance when the workers' balance ratio exceeds this
  int slots_per_worker = 0;  // experts a worker may host; 0: as many as the busiest hosts now
};

struct RebalanceResult {
  double balance_ratio_before = 1;
  double balance_ratio_after = 1;
  int64_t placement_version = 0;  // the version the plan switched the map to
  PlacementMap placement;         // the map after
};

class Rebalancer {
 public:
  // `registry` is borrowed and must outlive the rebalancer; `metrics` may be null.
  Rebalancer(WorkerRegistry* registry, RebalancePolicy policy, Metrics* metrics);
  ~Rebalancer();  // stops the automatic loop

  // Rebalances now with `slots_per_worker` experts per expert worker (exactly
  // that many; <= 0: as many as the busiest hosts now). FAILED_PRECONDITION
  // without expert workers; INVALID_ARGUMENT for an impossible plan;
  // UNAVAILABLE when a worker could not load its replicas (the map is then
  // unchanged).
  absl::StatusOr<RebalanceResult> Run(int slots_per_worker);

  // The expert workers' balance ratio from the load they reported since the
  // last successful rebalance: the busiest worker's share of the tokens over
  // the mean share (an expert's tokens split evenly over its replicas). 1
  // when there is no load yet.
  double ExpertBalanceRatio() const;

 private:
  // `total`'s load since the baseline (an expert whose total fell, a worker
  // having restarted, counts from 0).
  std::vector<double> LoadSinceBaseline(const std::vector<double>& total) const;
  // True once every attention worker routes by `version`, waiting until `deadline`.
  bool WaitForAttentionWorkers(int64_t version, std::chrono::steady_clock::time_point deadline);
  // After a rebalance: has each expert worker drop what `planned` no longer
  // routes to it (cold replicas), once the attention workers follow the map
  // without them; else keeps them (harmless: loaded, just not routed to).
  void DropColdReplicas(int64_t version, const std::map<std::string, std::vector<int>>& hosted,
                        const std::vector<WorkerInfo>& experts,
                        const std::vector<std::vector<int>>& planned);
  void AutoRebalance();

  WorkerRegistry* const registry_;
  const RebalancePolicy policy_;

  absl::Mutex run_mu_;  // one rebalance at a time
  mutable absl::Mutex mu_;
  // Tokens per expert (summed over workers) at the last successful rebalance:
  // balance is judged on what came since.
  std::vector<double> load_baseline_ ABSL_GUARDED_BY(mu_);
  // Null without metrics.
  prometheus::Counter* rebalances_ok_ = nullptr;
  prometheus::Counter* rebalances_failed_ = nullptr;
  prometheus::Histogram* rebalance_seconds_ = nullptr;
  prometheus::Gauge* balance_ratio_ = nullptr;
  prometheus::Counter* replicas_dropped_ = nullptr;
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace moesh

#endif  // MOESH_ROUTER_REBALANCER_H_
