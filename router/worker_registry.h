// The router's registry of workers: they register and heartbeat their load; a
// worker silent for longer than the timeout is dropped, and every call the
// router has in flight to it is cancelled (so its requests end UNAVAILABLE
// instead of hanging on a stalled peer). It also holds the versioned expert
// placement map (which expert worker hosts which experts) that attention
// workers route by, and the map version each of them reports following.
//
// Thread-safe. Owns a sweeper thread.
#ifndef MOESH_ROUTER_WORKER_REGISTRY_H_
#define MOESH_ROUTER_WORKER_REGISTRY_H_

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "moesh/v1/worker.pb.h"

namespace moesh {

struct WorkerInfo {
  std::string id;
  v1::WorkerKind kind = v1::WORKER_KIND_UNSPECIFIED;
  std::string address;
  std::string data_plane_address;  // where peers send data (KV); `address` if the worker gave none
  std::vector<int> expert_ids;
  bool computes_prompts = false;  // decode workers: RegisterRequest.computes_prompts
  v1::WorkerLoad load;
};

// A worker asking to join.
struct WorkerRegistration {
  v1::WorkerKind kind = v1::WORKER_KIND_UNSPECIFIED;
  std::string address;
  std::string data_plane_address;  // empty: `address`
  std::vector<int> expert_ids;
  std::string model_fingerprint;
  bool computes_prompts = false;
};

// The expert placement map: expert workers and what they host.
struct PlacementMap {
  struct Worker {
    std::string data_plane_address;
    std::vector<int> expert_ids;
  };
  int64_t version = 0;
  std::vector<Worker> workers;
};

class WorkerRegistry {
 public:
  WorkerRegistry(std::string model_fingerprint, std::chrono::milliseconds heartbeat_interval,
                 std::chrono::milliseconds timeout);
  ~WorkerRegistry();  // stops the sweeper

  // Adds a worker (replacing one registered from the same address) and
  // returns its id: the kind and 128 random bits ("DECODE-3f0c..."),
  // unguessable. FAILED_PRECONDITION for another model; INVALID_ARGUMENT
  // without a kind or an address.
  absl::StatusOr<std::string> Register(const WorkerRegistration& r);
  struct HeartbeatAnswer {
    bool known = false;             // false: the worker must register again
    int64_t placement_version = 0;  // the map's current version
  };
  // Records a live worker's load and the placement version it routes by
  // (`elsewhere`: it routes by another router's map, router HA). An expert
  // worker's `load.hosted_expert_ids` (when given) is what it holds: the map
  // routes to it all, or, once this router placed the worker's experts
  // (SetPlacement), to the plan's experts it holds; a change bumps the
  // version.
  HeartbeatAnswer Heartbeat(const std::string& worker_id, const v1::WorkerLoad& load,
                            int64_t placement_version, bool elsewhere = false);
  // A worker leaving on its own: dropped, its in-flight calls left to drain.
  void Deregister(const std::string& worker_id);

  // The workers of `kind` that take work: registered, not timed out, and not
  // draining (their heartbeats' load says so: they finish what they hold).
  std::vector<WorkerInfo> Live(v1::WorkerKind kind) const;
  // True iff the worker is still registered.
  bool IsLive(const std::string& worker_id) const;
  // Called (outside the lock) whenever the set of live workers changes.
  void OnChange(std::function<void()> callback);
  // Ties a cancellation to a worker: if the worker is dropped, `cancel` runs.
  // Returns a handle for Untrack. `cancel` must be cheap and thread-safe.
  int64_t Track(const std::string& worker_id, std::function<void()> cancel);
  void Untrack(int64_t handle);

  PlacementMap Placement() const;
  // Sets the experts each listed expert worker is routed to (workers gone
  // since are skipped) and returns the map's new version.
  int64_t SetPlacement(const std::map<std::string, std::vector<int>>& experts_by_worker);
  // True iff every live prefill and decode worker reported routing by
  // `version` or a newer map.
  bool AttentionWorkersFollow(int64_t version) const;
  // True iff no live prefill or decode worker reported routing by another
  // router's map: this router is the placement writer (router HA; vacuously
  // with no attention worker).
  bool IsPlacementWriter() const;

  std::chrono::milliseconds heartbeat_interval() const { return interval_; }

 private:
  struct Entry {
    WorkerInfo info;
    std::chrono::steady_clock::time_point last_seen;
    int64_t placement_version = 0;  // attention workers: the map version they route by
    bool elsewhere = false;         // attention workers: they route by another router's map
    std::vector<int> hosted;        // expert workers: what they hold (registration, heartbeats)
    std::vector<int> planned;       // expert workers: SetPlacement's experts; empty: none
  };
  // An expert worker's routed experts: `hosted`, or `planned` ∩ `hosted` once planned.
  static std::vector<int> Routed(const Entry& e);
  void Sweep();
  // By value: callers pass the key of the entry it erases.
  void Drop(std::string id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string fingerprint_;
  const std::chrono::milliseconds interval_;
  const std::chrono::milliseconds timeout_;

  mutable absl::Mutex mu_;
  std::map<std::string, Entry> workers_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;            // Track's handles
  int64_t placement_version_ ABSL_GUARDED_BY(mu_) = 1;  // bumped when expert workers change
  std::map<int64_t, std::pair<std::string, std::function<void()>>> tracked_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> to_cancel_ ABSL_GUARDED_BY(mu_);  // collected by Drop
  std::vector<std::function<void()>> on_change_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread sweeper_;
};

}  // namespace moesh

#endif  // MOESH_ROUTER_WORKER_REGISTRY_H_
