// The router's view of the cluster: workers register and heartbeat their
// load; a worker silent for longer than the timeout is dropped, and every
// call the router has in flight to it is cancelled (so its requests end
// UNAVAILABLE instead of hanging on a stalled peer).
//
// Thread-safe. Owns one sweeper thread.
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
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
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

class Membership final : public v1::Cluster::Service {
 public:
  Membership(std::string model_fingerprint, std::chrono::milliseconds heartbeat_interval,
             std::chrono::milliseconds timeout);
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
  };
  void Sweep();
  void Drop(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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
  absl::Mutex rebalance_mu_;  // one rebalance at a time
  absl::Notification stop_;
  std::thread sweeper_;
};

}  // namespace moesh

#endif  // MOESH_ROUTER_MEMBERSHIP_H_
