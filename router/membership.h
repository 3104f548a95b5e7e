// The router's view of the cluster: workers register and heartbeat their
// load; a worker silent for longer than the timeout is dropped, and every
// call the router has in flight to it is cancelled (so its requests end
// UNAVAILABLE instead of hanging on a stalled peer).
//
// Expert placement: the router owns a versioned map of which expert worker
// hosts which experts (GetPlacement); Rebalance (on demand, or every
// `rebalance.interval` when the expert workers' load is skewed beyond
// `rebalance.min_ratio`) replicates the hottest experts (router/eplb.h), has
// the workers load them while serving, then switches the map.
//
// Thread-safe. Owns a sweeper thread, and a rebalancer thread when automatic.
#ifndef MOESH_ROUTER_MEMBERSHIP_H_
#define MOESH_ROUTER_MEMBERSHIP_H_

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/metrics/metrics.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

struct WorkerInfo {
  std::string id;
  v1::WorkerKind kind = v1::WORKER_KIND_UNSPECIFIED;
  std::string address;
  std::string data_plane_address;  // where peers send data (KV); `address` if the worker gave none
  std::vector<int> expert_ids;
  v1::WorkerLoad load;
};

struct RebalancePolicy {
  std::chrono::seconds interval{0};  // 0: only on request (Cluster.Rebalance)
  double min_ratio = 1.25;           // rebalance when the workers' balance ratio exceeds this
  int slots_per_worker = 0;  // experts a worker may host; 0: as many as the busiest hosts now
};

class Membership final : public v1::Cluster::Service {
 public:
  // `metrics` may be null.
  Membership(std::string model_fingerprint, std::chrono::milliseconds heartbeat_interval,
             std::chrono::milliseconds timeout, RebalancePolicy rebalance = {},
             Metrics* metrics = nullptr);
  ~Membership() override;

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status GetPlacement(grpc::ServerContext*, const v1::GetPlacementRequest*,
                            v1::PlacementMap* response) override;
  grpc::Status Deregister(grpc::ServerContext*, const v1::DeregisterRequest* request,
                          v1::DeregisterResponse*) override;
  grpc::Status Rebalance(grpc::ServerContext*, const v1::RebalanceRequest* request,
                         v1::RebalanceResponse* response) override;

  std::vector<WorkerInfo> Live(v1::WorkerKind kind) const;
  // The expert workers' balance ratio from the load they reported since the
  // last successful rebalance: the busiest worker's share of the tokens over
  // the mean share (an expert's tokens split evenly over its replicas). 1
  // when there is no load yet.
  double ExpertBalanceRatio() const;
  // Called (outside the lock) whenever the set of live workers changes.
  void OnChange(std::function<void()> callback);

  // Ties a cancellation to a worker: if the worker is dropped, `cancel` runs.
  // Returns a handle for Untrack. `cancel` must be cheap and thread-safe.
  int64_t Track(const std::string& worker_id, std::function<void()> cancel);
  void Untrack(int64_t handle);
  // True iff the worker is still registered.
  bool IsLive(const std::string& worker_id) const;

 private:
  struct Entry {
    WorkerInfo info;
    std::chrono::steady_clock::time_point last_seen;
    int64_t placement_version = 0;  // attention workers: the map version they route by
  };
  void Sweep();
  void Drop(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The Rebalance RPC's work; counted and timed in the metrics.
  absl::StatusOr<v1::RebalanceResponse> RunRebalance(int slots_per_worker);
  // True once every live prefill and decode worker routes by `version` (or
  // a newer map), waiting until `deadline`.
  bool AttentionWorkersFollow(int64_t version, std::chrono::steady_clock::time_point deadline);
  // After a rebalance: has each expert worker drop what `planned` no longer
  // routes to it (cold replicas), once the attention workers follow the map
  // without them; else keeps them (harmless: loaded, just not routed to).
  void DropColdReplicas(int64_t version, const std::map<std::string, std::vector<int>>& hosted,
                        const std::vector<WorkerInfo>& experts,
                        const std::vector<std::vector<int>>& planned);
  // The automatic rebalancer's loop.
  void AutoRebalance();

  const std::string fingerprint_;
  const std::chrono::milliseconds interval_;
  const std::chrono::milliseconds timeout_;

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t placement_version_ ABSL_GUARDED_BY(mu_) = 1;  // bumped when expert workers change
  std::map<int64_t, std::pair<std::string, std::function<void()>>> tracked_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> to_cancel_ ABSL_GUARDED_BY(mu_);  // collected by Drop
  std::vector<std::function<void()>> on_change_ ABSL_GUARDED_BY(mu_);
  // Tokens per expert (summed over workers) at the last successful rebalance:
  // balance is judged on what came since.
  std::vector<double> load_baseline_ ABSL_GUARDED_BY(mu_);
  // `experts`' load since the baseline (an expert whose total fell, a worker
  // having restarted, counts from 0).
  std::vector<double> LoadSinceBaseline(const std::vector<double>& total) const;
  absl::Mutex rebalance_mu_;  // one rebalance at a time
  const RebalancePolicy policy_;
  // Null without metrics.
  prometheus::Counter* rebalances_ok_ = nullptr;
  prometheus::Counter* rebalances_failed_ = nullptr;
  prometheus::Histogram* rebalance_seconds_ = nullptr;
  prometheus::Gauge* balance_ratio_ = nullptr;
  prometheus::Counter* replicas_dropped_ = nullptr;
  absl::Notification stop_;
  std::thread sweeper_;
  std::thread rebalancer_;
};

}  // namespace moesh

#endif  // MOESH_ROUTER_MEMBERSHIP_H_
