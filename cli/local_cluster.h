// Starts a moesh cluster as separate processes on loopback: a router, expert
// workers, prefill and decode workers; waits until the router's Generation
// service is SERVING (grpc.health.v1); stops them all on destruction.
// Used by `moesh serve-local` and the integration tests. Not thread-safe.
#ifndef MOESH_CLI_LOCAL_CLUSTER_H_
#define MOESH_CLI_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moesh {

struct LocalClusterOptions {
  std::string model_dir;
  std::string bin_dir;   // where moesh_router, moesh_*_worker live
  std::string work_dir;  // ready files and logs (created)
  int router_port = 0;   // 0: any free port
  // One entry per expert worker: its --experts spec ("0-3"), or "i/n" as a
  // --shard. Empty: two workers with half the experts each.
  std::vector<std::string> expert_workers;
  int num_prefill = 1;
  int num_decode = 1;
  std::string transport = "grpc";
  // Attention workers take the expert placement from the router (versioned,
  // followed as expert workers come and go); false: --expert_workers flags.
  bool placement_from_router = true;
  int kv_blocks = 512;
  // --device of the prefill, decode and expert workers: cpu, cuda or cuda:N.
  // On one GPU the decode worker may bring the device to 60% of its memory,
  // the prefill worker (started after it) to 80%.
  std::string device = "cpu";
  // --device of the expert workers when not empty (e.g. cuda:1: attention on
  // one GPU, experts on another), or a comma-separated list the workers take
  // in turn (cuda:1,cuda:2,cuda:3: one expert worker per GPU).
  std::string expert_device;
  // --load_format of every worker (and the colocated router): auto or dummy.
  std::string load_format = "auto";
  int heartbeat_timeout_ms = 3000;
  std::vector<std::string> extra_router_flags;
  std::vector<std::string> extra_attention_worker_flags;  // prefill and decode workers
  std::vector<std::string> extra_prefill_flags;           // prefill workers only
  std::chrono::seconds startup_timeout{120};
};

class LocalCluster {
 public:
  struct Process {
    std::string name;  // "router", "expert-0", "prefill-0", "decode-0"
    pid_t pid = -1;
    std::string address;
    std::string metrics_address;  // host:port of /metrics
    std::string log_path;
  };

  static absl::StatusOr<std::unique_ptr<LocalCluster>> Start(const LocalClusterOptions& options);
  ~LocalCluster();  // SIGTERM, then SIGKILL after a grace period

  const std::string& router_address() const { return processes_.front().address; }
  const std::vector<Process>& processes() const { return processes_; }
  // Sends `signal` to the named process (SIGKILL: it is gone for good).
  absl::Status Signal(const std::string& name, int signal);
  // Starts one more expert worker ("expert-<n>") with --experts/--shard `spec`.
  absl::Status AddExpertWorker(const std::string& spec);
  // Waits until the router reports its Generation service SERVING.
  absl::Status WaitUntilServing(std::chrono::seconds timeout) const;

 private:
  explicit LocalCluster(LocalClusterOptions options) : options_(std::move(options)) {}
  absl::StatusOr<Process> Spawn(const std::string& name, const std::string& binary,
                                std::vector<std::string> flags);
  void StopAll();

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
