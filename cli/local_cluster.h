// Starts a moesh cluster as separate processes on loopback: one or more
// routers, expert workers, prefill and decode workers; waits until every
// router's Generation service is SERVING (grpc.health.v1); stops them all on
// destruction.
// Used by `moesh serve-local` and the integration tests. Not thread-safe.
#ifndef MOESH_CLI_LOCAL_CLUSTER_H_
#define MOESH_CLI_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/internal_plane.h"
#include "decode_worker/flags.h"
#include "expert_worker/flags.h"
#include "prefill_worker/flags.h"
#include "router/flags.h"

namespace moesh {

// On one GPU the decode worker may bring the device to 60% of its memory,
// the prefill worker (started after it) to 80%; on the CPU the decode worker
// holds 512 KV blocks.
PrefillWorkerOptions LocalPrefillDefaults();
DecodeWorkerOptions LocalDecodeDefaults();

struct LocalClusterOptions {
  std::string model_dir;  // every process's --model
  std::string bin_dir;    // where moesh_router, moesh_*_worker live
  std::string work_dir;   // ready files and logs (created)
  // One entry per expert worker: its --experts spec ("0-3"), or "i/n" as a
  // --shard. Empty: two workers with half the experts each.
  std::vector<std::string> expert_workers;
  int num_prefill = 1;
  int num_decode = 1;
  // Routers ("router" when one, else "router-0", "router-1", ...): every
  // worker registers with all of them (--router lists their internal planes).
  int num_routers = 1;
  // Attention workers take the expert placement from the router (versioned,
  // followed as expert workers come and go); false: --expert_workers flags.
  bool placement_from_router = true;
  // Each binary's options, rendered as its command line (router/flags.h and
  // the workers' flags.h), less what Start fills in per process: --model,
  // --ready_file, the workers' --router, the attention workers'
  // --expert_workers, the expert workers' --experts or --shard. The router
  // listens on router.server.listen (default: any free port).
  RouterOptions router;
  PrefillWorkerOptions prefill = LocalPrefillDefaults();
  DecodeWorkerOptions decode = LocalDecodeDefaults();
  ExpertWorkerOptions expert;
  // When not empty, the expert workers take these --device values in turn
  // instead of expert.device's (cuda:1,cuda:2,cuda:3: one expert worker per
  // GPU; attention on another).
  std::vector<std::string> expert_devices;
  std::chrono::seconds startup_timeout{120};
  // Every process's --tls_cert, --tls_key, --tls_ca (MakeLocalCertificates):
  // mutual TLS on the internal plane; empty: plaintext. With
  // router.public_tls the public port is checked against tls.ca.
  TlsFiles tls;
};

// Sets the prefill, decode and expert workers' --device, --load_format (dummy
// weights or the checkpoint's) and --quantization from `device` (the command
// line's device flags), so none of them is dropped on the way.
void SetWorkerDevice(const DeviceOptions& device, LocalClusterOptions* o);
// Sets the prefill, decode and expert workers' --transport.
void SetWorkerTransport(const std::string& transport, LocalClusterOptions* o);

class LocalCluster {
 public:
  struct Process {
    std::string name;  // "router", "expert-0", "prefill-0", "decode-0"
    pid_t pid = -1;
    std::string address;
    std::string metrics_address;   // host:port of /metrics
    std::string internal_address;  // the router's internal plane (workers register there)
    std::string http_address;      // the router's HTTP API (--http_listen); empty: off
    std::string log_path;
    std::string binary;              // for Restart
    std::vector<std::string> flags;  // for Restart: a router's with the ports it took
  };

  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();  // SIGTERM, then SIGKILL after a grace period

  // The (first) router's public address.
  const std::string& router_address() const { return processes_.front().address; }
  // Every router's public address, in order.
  std::vector<std::string> router_addresses() const;
  // Where workers register (moesh.v1.Cluster): the routers' internal planes,
  // comma-separated (--router).
  std::string router_internal_address() const;
  // The router's OpenAI-compatible HTTP API (host:port); empty without
  // router.http_listen.
  const std::string& router_http_address() const { return processes_.front().http_address; }
  const std::vector<Process>& processes() const { return processes_; }
  // Sends `signal` to the named process (SIGKILL: it is gone for good).
  absl::Status Signal(const std::string& name, int signal);
  // Waits up to `timeout` for the named process to exit (e.g. after SIGTERM):
  // its exit code (128 + the signal if a signal ended it); DEADLINE_EXCEEDED
  // while it still runs, NOT_FOUND if there is no such running process.
  absl::StatusOr<int> WaitForExit(const std::string& name, std::chrono::milliseconds timeout);
  // Starts one more expert worker ("expert-<n>") with --experts/--shard `spec`.
  absl::Status AddExpertWorker(const std::string& spec);
  // Starts the named process again after it exited, with its command line
  // (a router on the ports it had: the workers' --router still names it).
  absl::Status Restart(const std::string& name);
  // Waits until every router reports its Generation service SERVING.
  absl::Status WaitUntilServing(std::chrono::seconds timeout) const;
  // Waits until the router at `address` (public) reports SERVING.
  absl::Status WaitUntilRouterServing(const std::string& address,
                                      std::chrono::seconds timeout) const;
  // Waits until every router holds every worker this cluster started as a
  // member (its moesh_router_workers gauges by kind): a router is SERVING
  // with one prefill and one decode worker, before the rest have joined.
  absl::Status WaitUntilJoined(std::chrono::seconds timeout) const;

 private:
  explicit LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}
  std::string ReadyFile(const std::string& name) const;
  // Sets --model and --ready_file of process `name`.
  void SetServer(const std::string& name, ServerOptions* server) const;
  // A process to start: `flags` as SetServer filled them in for `name`.
  struct Launchable {
    std::string name;
    std::string binary;
    std::vector<std::string> flags;
    bool on_cpu = true;  // its --device is the CPU
  };
  // Starts `binary` with `flags` (which SetServer filled in for `name`),
  // tracked in processes_ without its addresses.
  absl::Status Launch(const std::string& name, const std::string& binary,
                      const std::vector<std::string>& flags);
  // Waits for processes_[index]'s ready file and fills in its addresses.
  absl::StatusOr<Process> AwaitReady(size_t index);
  // Launch, then AwaitReady.
  absl::StatusOr<Process> Spawn(const std::string& name, const std::string& binary,
                                const std::vector<std::string>& flags);
  // Starts `group` in order: `together`, every one launched before waiting
  // for the first's ready file; else each once the one before it is ready.
  absl::Status SpawnAll(const std::vector<Launchable>& group, bool together);
  // The expert worker for --experts/--shard `spec`, named after the expert
  // workers started so far plus `pending` more about to start.
  absl::StatusOr<Launchable> ExpertWorker(const std::string& spec, int pending) const;
  void StopAll();
  // Waits until `p` exited (reaped: pid -1) or `give_up`: its exit code (128 +
  // the signal if a signal ended it), or DEADLINE_EXCEEDED.
  absl::StatusOr<int> Reap(Process& p, std::chrono::steady_clock::time_point give_up);

  const LocalClusterOptions options_;
  std::vector<Process> processes_;
};

// A service's Prometheus text (GET /metrics from host:port); UNAVAILABLE if
// it does not answer.
absl::StatusOr<std::string> ScrapeMetrics(const std::string& address);
// The value of the first series in `text` whose line starts with `series`
// (a name, or a name with its labels); -1 if there is none.
double MetricValue(absl::string_view text, absl::string_view series);
// The sum over every series whose line starts with `prefix`.
double MetricSum(absl::string_view text, absl::string_view prefix);

}  // namespace moesh

#endif  // MOESH_CLI_LOCAL_CLUSTER_H_
