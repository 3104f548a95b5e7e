#include "common/service/worker_main.h"

#include <iostream>
#include <memory>
#include <thread>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/model/safetensors.h"
#include "common/service/router_links.h"
#include "common/service/worker_util.h"

namespace moesh {

absl::Status ServeUntilSignal(grpc::Server* server, const ServeOptions& o) {
  std::unique_ptr<RouterLinks> heartbeat;
  if (!o.router.empty()) {
    auto load = o.load ? o.load : [] { return v1::WorkerLoad(); };
    heartbeat =
        std::make_unique<RouterLinks>(o.router, o.registration, load, o.on_placement_version);
  }
  if (!o.ready_file.empty()) {
    if (absl::Status s = WriteReadyFile(o.ready_file, o.address, o.metrics_address,
                                        o.internal_address, o.http_address);
        !s.ok())
      return s;
  }
  WaitForShutdownSignal();
  if ((o.drain || o.in_flight) && o.drain_timeout.count() > 0) {
    if (o.drain) o.drain();
    if (heartbeat && o.leave_first) {
      heartbeat.reset();  // deregisters: the router sends no more work this way
      std::cerr << o.name << " left the cluster" << std::endl;
    } else if (heartbeat) {
      heartbeat->BeatNow();  // the router stops sending work at once
    }
    const auto deadline = std::chrono::steady_clock::now() + o.drain_timeout;
    int left = o.in_flight ? o.in_flight() : 0;
    std::cerr << o.name << " draining: " << left << " requests in flight" << std::endl;
    // A bounded wait of the shutdown path for the requests to end: a poll
    // here delays nothing that serves.
    while (left > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      left = o.in_flight();
    }
    if (left > 0) {
      std::cerr << o.name << ": drain timeout (" << o.drain_timeout.count() << " s) with " << left
                << " requests in flight; they fail" << std::endl;
    }
  }
  std::cerr << o.name << " shutting down" << std::endl;
  heartbeat.reset();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return absl::OkStatus();
}

int ServiceMain(int argc, char** argv, const char* usage, const char* name, absl::Status (*run)()) {
  BlockShutdownSignals();  // before any thread starts: they all inherit it
  absl::SetProgramUsageMessage(usage);
  absl::ParseCommandLine(argc, argv);
  // absl's Mutex deadlock detection (on in a libabsl built without NDEBUG, as
  // Debian's is) keeps a process-wide lock-order graph updated under every
  // Mutex a thread takes: a serving process takes several a token. The unit
  // tests keep it.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  // Weight loads print their progress (MOESH_QUIET_LOAD=1 silences it).
  SetDefaultLoadProgress(StderrLoadProgress(absl::StrCat(name, ": loading weights")));
  const absl::Status s = run();
  if (!s.ok()) {
    std::cerr << name << ": " << s.message() << std::endl;
    return 1;
  }
  return 0;
}

ServeOptions WorkerServeOptions(std::string name, v1::WorkerKind kind, const std::string& address,
                                const std::string& fingerprint, const ServerOptions& server,
                                const WorkerOptions& worker, const Metrics& metrics) {
  ServeOptions serve;
  serve.name = std::move(name);
  serve.router = worker.router;
  serve.registration.set_kind(kind);
  serve.registration.set_address(address);
  serve.registration.set_model_fingerprint(fingerprint);
  serve.ready_file = server.ready_file;
  serve.drain_timeout = std::chrono::seconds(server.drain_timeout_s);
  serve.address = address;
  if (metrics.port() > 0)
    serve.metrics_address = absl::StrCat(worker.advertise_host, ":", metrics.port());
  return serve;
}

}  // namespace moesh
