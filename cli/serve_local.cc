// moesh serve-local: the whole cluster on loopback, until Ctrl-C.
#include <sys/stat.h>
#include <unistd.h>

#include <iostream>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "base/status.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/local_certs.h"
#include "cli/local_cluster.h"
#include "common/service/device_flags.h"
#include "common/service/worker_util.h"
#include "common/transport/dispatch_wire.h"
#include "router/routing_policy.h"

ABSL_FLAG(int, port, 50051, "The router's port on 127.0.0.1 (0: any free one).");
ABSL_FLAG(int, http_port, 0,
          "The router's OpenAI-compatible HTTP API on 127.0.0.1 (0: any free port; -1: off).");
ABSL_FLAG(std::string, api_keys_file, "",
          "The router's API keys, one per line: its HTTP API and gRPC Generation API then need "
          "'Authorization: Bearer <key>' (empty: no key needed).");
ABSL_FLAG(std::string, work_dir, "",
          "Where the processes' logs and ready files go (default: /tmp/moesh-serve-local-<pid>).");
ABSL_FLAG(std::optional<int>, kv_blocks, std::nullopt,
          "The decode worker's KV cache blocks (--device cpu; serve-local: 512 unless set; bench "
          "--serving: 4096 unless set, a smaller pool preempts).");
ABSL_FLAG(int, decode_workers, 1,
          "Decode workers to start (with two or more, a stream survives one's death: the router "
          "continues it on another).");
ABSL_FLAG(int, prefill_workers, 1,
          "Prefill workers to start (the router sends each prompt to one by --routing_policy).");
ABSL_FLAG(std::string, routing_policy, "kv_aware",
          "The router's --routing_policy: kv_aware (load and prefix caches), load (load alone) "
          "or round_robin (in turn).");
ABSL_FLAG(int, max_local_prefill_tokens, moesh::RouterOptions().max_local_prefill_tokens,
          "The router's --max_local_prefill_tokens: a prompt with at most this many tokens not "
          "cached on its decode worker is computed there, mixed into its decode steps, instead "
          "of on a prefill worker (0: every prompt goes to a prefill worker).");
ABSL_FLAG(bool, enable_prefix_caching, moesh::KvOptions().enable_prefix_caching,
          "The prefill and decode workers' --enable_prefix_caching (=false: every prompt is "
          "computed whole, the baseline of a cache measurement).");
ABSL_FLAG(int, routers, 1,
          "Routers to start (router HA: every worker registers with each; clients may use any, "
          "and a router's death fails only its own streams). The first listens on --port, the "
          "others on free ports.");
ABSL_FLAG(std::string, transport, "grpc",
          "The data plane between the attention and the expert workers: grpc, ucx, nccl (GPUs) "
          "or cuda_ipc (GPUs of one node).");
ABSL_FLAG(std::string, dispatch_dtype, "fp32",
          "The prefill and decode workers' --dispatch_dtype: how expert dispatches' hidden "
          "states travel on the host wire (grpc, ucx): fp32, bf16 or fp8.");

ABSL_FLAG(bool, tls, false,
          "Mutual TLS between the processes (the internal plane) with a throwaway CA and "
          "certificate made with openssl in <work_dir>/certs; the public port stays plaintext.");

namespace moesh::cli {

absl::Status RunServeLocal() {
  LocalClusterOptions opt;
  ASSIGN_OR_RETURN(opt.model_dir, ModelFlag());
  opt.router.server.listen = absl::StrCat("127.0.0.1:", absl::GetFlag(FLAGS_port));
  opt.router.api_keys_file = absl::GetFlag(FLAGS_api_keys_file);
  if (const int http_port = absl::GetFlag(FLAGS_http_port); http_port >= 0) {
    opt.router.http_listen = absl::StrCat("127.0.0.1:", http_port);
  }
  const int n = absl::GetFlag(FLAGS_expert_workers);
  if (n < 1) return absl::InvalidArgumentError("--expert_workers must be >= 1");
  for (int i = 0; i < n; ++i) opt.expert_workers.push_back(absl::StrCat(i, "/", n));
  opt.decode.kv.kv_blocks = absl::GetFlag(FLAGS_kv_blocks).value_or(512);
  opt.num_decode = absl::GetFlag(FLAGS_decode_workers);
  if (opt.num_decode < 1 || opt.num_decode > 16)
    return absl::InvalidArgumentError("--decode_workers must be in [1, 16]");
  opt.num_prefill = absl::GetFlag(FLAGS_prefill_workers);
  if (opt.num_prefill < 1 || opt.num_prefill > 16)
    return absl::InvalidArgumentError("--prefill_workers must be in [1, 16]");
  ASSIGN_OR_RETURN(opt.router.routing_policy,
                   ParseRoutingPolicy(absl::GetFlag(FLAGS_routing_policy)));
  opt.router.max_local_prefill_tokens = absl::GetFlag(FLAGS_max_local_prefill_tokens);
  if (opt.router.max_local_prefill_tokens < 0)
    return absl::InvalidArgumentError("--max_local_prefill_tokens must be >= 0");
  opt.prefill.kv.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  opt.decode.kv.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  opt.num_routers = absl::GetFlag(FLAGS_routers);
  if (opt.num_routers < 1 || opt.num_routers > 16)
    return absl::InvalidArgumentError("--routers must be in [1, 16]");
  ASSIGN_OR_RETURN(const DeviceOptions device, DeviceOptionsFromFlags());
  SetWorkerDevice(device, &opt);
  RETURN_IF_ERROR(SetWorkerMemoryFromFlags(&opt));
  ASSIGN_OR_RETURN(opt.expert_devices, ExpertDevicesFlag());
  SetWorkerTransport(absl::GetFlag(FLAGS_transport), &opt);
  const std::string dispatch_dtype = absl::GetFlag(FLAGS_dispatch_dtype);
  RETURN_IF_ERROR(ParseDispatchDType(dispatch_dtype).status());
  opt.prefill.dispatch.dispatch_dtype = dispatch_dtype;
  opt.decode.dispatch.dispatch_dtype = dispatch_dtype;
  opt.bin_dir = BinDirFlag();
  opt.work_dir = absl::GetFlag(FLAGS_work_dir);
  if (opt.work_dir.empty()) opt.work_dir = absl::StrCat("/tmp/moesh-serve-local-", getpid());
  if (absl::GetFlag(FLAGS_tls)) {
    mkdir(opt.work_dir.c_str(), 0755);
    ASSIGN_OR_RETURN(opt.tls, MakeLocalCertificates(JoinPath(opt.work_dir, "certs")));
    std::cerr << "internal plane: mutual TLS, CA " << opt.tls.ca << std::endl;
  }
  std::cerr << "starting " << opt.num_routers << (opt.num_routers == 1 ? " router, " : " routers, ")
            << n << " expert workers, " << opt.num_prefill << " prefill and " << opt.num_decode
            << " decode workers on " << device.device << " (logs in " << opt.work_dir << ") ..."
            << std::endl;
  // Block the signals before spawning so only this process waits for them.
  ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> cluster, LocalCluster::Start(opt));
  for (const LocalCluster::Process& p : cluster->processes()) {
    std::cerr << "  " << p.name << "  pid " << p.pid << "  grpc " << p.address
              << "  metrics http://" << p.metrics_address << "/metrics"
              << (p.internal_address.empty() ? "" : "  internal " + p.internal_address)
              << (p.http_address.empty() ? "" : "  http://" + p.http_address) << std::endl;
  }
  const std::string servers = absl::StrJoin(cluster->router_addresses(), ",");
  std::cout << "moesh is serving on " << servers << "\n"
            << "try: moesh complete --server=" << servers
            << " --prompt_ids=5,17,300 --max_new_tokens=16\n";
  if (!cluster->router_http_address().empty()) {
    const std::string url = "http://" + cluster->router_http_address();
    std::cout << "OpenAI-compatible HTTP API on " << url << "/v1\n"
              << "try: curl " << url << "/v1/completions -H 'Content-Type: application/json' "
              << "-d '{\"prompt\": \"Hello\", \"max_tokens\": 16}'\n";
  }
  std::cout << "Ctrl-C stops everything." << std::endl;
  WaitForShutdownSignal();
  std::cerr << "stopping ..." << std::endl;
  return absl::OkStatus();
}

}  // namespace moesh::cli
