// A worker's links to its routers (router HA): `--router` names one or more
// routers, comma-separated host:port entries, each resolved through DNS (a
// Kubernetes headless Service names every router pod) and re-resolved every
// `kRouterResolveInterval` (every second while nothing resolves), so a new
// router pod is found and a gone one forgotten. The worker registers and
// heartbeats with each router address independently: one HeartbeatClient
// (its own thread, its own worker id) per address, so a router that does not
// answer delays no heartbeat to another.
//
// The placement writer — the router whose expert placement map the attention
// workers route by and an expert worker checks drops against — is the lowest
// address (string order) among the routers whose last registration or
// heartbeat succeeded (RouterElection). Every worker applies the same rule,
// so they agree while they see the same routers; the others' heartbeats say
// `placement_elsewhere`, and a router that sees that refuses to rebalance.
//
// Thread-safe. Owns a resolver thread and one thread per router.
#ifndef MOESH_COMMON_SERVICE_ROUTER_LINKS_H_
#define MOESH_COMMON_SERVICE_ROUTER_LINKS_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/service/heartbeat_client.h"
#include "moesh/v1/worker.pb.h"

namespace moesh {

inline constexpr std::chrono::seconds kRouterResolveInterval{10};

// The addresses `routers` names now: each comma-separated host:port entry
// resolved (a host's IPv4 addresses, else its IPv6 ones, "[v6]:port"),
// distinct and sorted. INVALID_ARGUMENT for an entry that is not host:port,
// UNAVAILABLE when a name does not resolve.
absl::StatusOr<std::vector<std::string>> ResolveRouters(const std::string& routers);

// Which router is the placement writer: the lowest address reported up.
class RouterElection {
 public:
  void Report(const std::string& address, bool up);
  void Forget(const std::string& address);
  // True iff `address` is the lowest address reported up.
  bool IsWriter(const std::string& address) const;
  // The writer's address; empty while no router is up.
  std::string Writer() const;

 private:
  mutable absl::Mutex mu_;
  std::set<std::string> up_ ABSL_GUARDED_BY(mu_);
};

class RouterLinks {
 public:
  // `routers` as --router takes it (not empty). `load` and
  // `on_placement_version` as HeartbeatClient takes them; the latter is
  // called only for the placement writer's versions.
  RouterLinks(std::string routers, v1::RegisterRequest registration,
              std::function<v1::WorkerLoad()> load, PlacementFollower on_placement_version);
  ~RouterLinks();  // stops every link (each deregisters, best effort)

  // Each link sends its next heartbeat now.
  void BeatNow();

 private:
  void Resolve();  // adds links to new addresses, drops those of vanished ones

  const std::string routers_;
  const v1::RegisterRequest registration_;
  const std::function<v1::WorkerLoad()> load_;
  const PlacementFollower on_placement_version_;
  RouterElection election_;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<HeartbeatClient>> links_ ABSL_GUARDED_BY(mu_);
  bool warned_ ABSL_GUARDED_BY(mu_) = false;
  absl::Notification stop_;
  std::thread resolver_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_ROUTER_LINKS_H_
