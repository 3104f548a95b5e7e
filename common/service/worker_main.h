// The life of a service process after its servers started, shared by every
// moesh binary: register with the router and heartbeat (when a router is
// given), write the ready file, wait for SIGINT/SIGTERM, then drain: stop
// taking new work (`drain`; the heartbeats tell the router, which sends no
// more), wait until nothing is in flight or the drain timeout passed, and
// only then deregister and shut the gRPC server down. A worker whose work
// comes by the placement map (an expert worker) deregisters first instead
// (`leave_first`): the router takes it out of the map, and it serves what
// arrives until the attention workers follow the map without it.
#ifndef MOESH_COMMON_SERVICE_WORKER_MAIN_H_
#define MOESH_COMMON_SERVICE_WORKER_MAIN_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/metrics/metrics.h"
#include "common/service/heartbeat_client.h"
#include "common/service/server_flags.h"
#include "common/service/worker_flags.h"
#include "moesh/v1/worker.pb.h"

namespace moesh {

struct ServeOptions {
  std::string name;                        // "expert worker", for logs
  std::string router;                      // --router (a list, DNS names); empty: do not register
  v1::RegisterRequest registration;        // kind, address, ... (with a router)
  std::function<v1::WorkerLoad()> load;    // heartbeat payload; may be null
  PlacementFollower on_placement_version;  // may be null
  std::string ready_file;                  // empty: none
  std::string address;                     // gRPC host:port
  std::string metrics_address;             // /metrics host:port
  std::string internal_address;            // the router's internal plane; empty: none
  std::string http_address;                // the router's HTTP API; empty: none
  // Graceful shutdown (may be null: none): stops admitting new work.
  std::function<void()> drain;
  std::function<int()> in_flight;  // requests still held; may be null: none
  // Deregister when the drain starts rather than after it (with a router).
  bool leave_first = false;
  std::chrono::seconds drain_timeout{30};
};

absl::Status ServeUntilSignal(grpc::Server* server, const ServeOptions& options);

// A worker's ServeOptions from its flag groups: `name`, registering as `kind`
// with the model `fingerprint` at `address` (gRPC host:port) with
// worker.router, its ready file, and its /metrics address at
// worker.advertise_host (none when `metrics` serves none).
ServeOptions WorkerServeOptions(std::string name, v1::WorkerKind kind, const std::string& address,
                                const std::string& fingerprint, const ServerOptions& server,
                                const WorkerOptions& worker, const Metrics& metrics);

// A service main(): parses Abseil flags, runs `run`, and on error prints
// "<name>: <message>" and returns 1. Weight loads report their progress to
// stderr (StderrLoadProgress).
int ServiceMain(int argc, char** argv, const char* usage, const char* name, absl::Status (*run)());

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_WORKER_MAIN_H_
