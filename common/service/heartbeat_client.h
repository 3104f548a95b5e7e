// A worker's membership with one router: registers with it, then heartbeats
// its load until stopped; re-registers if the router forgot it. Several
// routers: one client each (common/service/router_links.h).
// Thread-safe; owns one background thread.
#ifndef MOESH_COMMON_SERVICE_HEARTBEAT_CLIENT_H_
#define MOESH_COMMON_SERVICE_HEARTBEAT_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

class RouterElection;  // common/service/router_links.h

// Switches an attention worker to placement `version` of the router at
// `router` (its internal host:port): OK once it routes by that map (or a
// newer one).
using PlacementFollower = std::function<absl::Status(const std::string& router, int64_t version)>;

class HeartbeatClient {
 public:
  // `load` is called from the background thread before each heartbeat;
  // `on_placement_version` (may be null) whenever the router's placement
  // version differs from the last one followed, starting with the first;
  // the heartbeats then report the version followed (the router drops cold
  // replicas once every attention worker follows the map without them).
  // With `election` (several routers; borrowed, outlives the client) the
  // client reports whether its router answers, follows the router's
  // placement only while it is the writer, and else tells the router the
  // worker routes by another's map (`placement_elsewhere`).
  HeartbeatClient(std::string router_address, v1::RegisterRequest registration,
                  std::function<v1::WorkerLoad()> load,
                  PlacementFollower on_placement_version = nullptr,
                  RouterElection* election = nullptr);
  ~HeartbeatClient();  // stops the thread and deregisters (best effort)

  // Sends the next heartbeat now rather than at its interval (e.g. the load
  // says the worker is draining).
  void BeatNow();

 private:
  void Loop();
  static void Deregister(v1::Cluster::Stub* stub, const std::string& worker_id);

  const std::string router_address_;
  const v1::RegisterRequest registration_;
  const std::function<v1::WorkerLoad()> load_;
  const PlacementFollower on_placement_version_;
  RouterElection* const election_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool beat_now_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_HEARTBEAT_CLIENT_H_
