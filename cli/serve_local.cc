// moesh serve-local: the whole cluster on loopback, until Ctrl-C.
#include <unistd.h>

#include <iostream>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/local_cluster.h"
#include "common/base/status.h"
#include "common/service/worker_flags.h"

namespace moesh::cli {

absl::Status RunServeLocal(const std::vector<std::string>& argv) {
  ASSIGN_OR_RETURN(
      Args args, Args::Parse(argv,
                             {"model", "port", "expert-workers", "bin-dir", "work-dir", "kv-blocks",
                              "device", "expert-device", "transport", "load-format"},
                             {}));
  LocalClusterOptions opt;
  ASSIGN_OR_RETURN(opt.model_dir, args.Required("model"));
  ASSIGN_OR_RETURN(int64_t port, args.Int("port", 50051));
  opt.router_port = static_cast<int>(port);
  ASSIGN_OR_RETURN(int64_t n, args.Int("expert-workers", 2));
  if (n < 1) return absl::InvalidArgumentError("--expert-workers must be >= 1");
  for (int64_t i = 0; i < n; ++i) opt.expert_workers.push_back(absl::StrCat(i, "/", n));
  ASSIGN_OR_RETURN(int64_t blocks, args.Int("kv-blocks", 512));
  opt.kv_blocks = static_cast<int>(blocks);
  opt.device = args.Get("device").value_or("cpu");
  opt.expert_device = args.Get("expert-device").value_or("");
  opt.transport = args.Get("transport").value_or("grpc");
  opt.load_format = args.Get("load-format").value_or("auto");
  // The service binaries sit beside this one.
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string bin = len > 0 ? std::string(self, len) : "./moesh";
  opt.bin_dir = args.Get("bin-dir").value_or(bin.substr(0, bin.rfind('/')));
  opt.work_dir = args.Get("work-dir").value_or(absl::StrCat("/tmp/moesh-serve-local-", getpid()));
  std::cerr << "starting router, " << n << " expert workers, a prefill and a decode worker on "
            << opt.device << " (logs in " << opt.work_dir << ") ..." << std::endl;
  // Block the signals before spawning so only this process waits for them.
  ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> cluster, LocalCluster::Start(opt));
  for (const LocalCluster::Process& p : cluster->processes()) {
    std::cerr << "  " << p.name << "  pid " << p.pid << "  grpc " << p.address
              << "  metrics http://" << p.metrics_address << "/metrics" << std::endl;
  }
  std::cout << "moesh is serving on " << cluster->router_address() << "\n"
            << "try: moesh complete --server " << cluster->router_address()
            << " --prompt-ids 5,17,300 --max-new-tokens 16\n"
            << "Ctrl-C stops everything." << std::endl;
  WaitForShutdownSignal();
  std::cerr << "stopping ..." << std::endl;
  return absl::OkStatus();
}

}  // namespace moesh::cli
