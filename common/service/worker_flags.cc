#include "common/service/worker_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, router, moesh::WorkerOptions().router,
          "The routers' cluster addresses to register and heartbeat with: host:port, or several "
          "comma-separated; a name resolving to several addresses (a headless Service) is each "
          "of them, re-resolved every 10 s. Each router is joined on its own; attention workers "
          "route by the placement map of the lowest address that answers (empty: none; an expert "
          "worker then serves whoever dials it, a prefill or decode worker needs "
          "--expert_workers or loads every expert itself).");
ABSL_FLAG(std::string, advertise_host, moesh::WorkerOptions().advertise_host,
          "Host name or IP the router and other workers reach this worker at (with the port it "
          "listens on: the address it registers and reports).");
ABSL_FLAG(std::string, transport, moesh::WorkerOptions().transport,
          "The data plane between prefill/decode and expert workers, the same on every worker: "
          "grpc, ucx, nccl (GPUs) or cuda_ipc (GPUs of one node). Expert workers serve it beside "
          "gRPC; prefill and decode workers dispatch over it. With nccl the KV handoff's message "
          "goes over gRPC (see the prefill worker's --kv_handoff).");

namespace moesh {

WorkerOptions WorkerOptionsFromFlags() {
  WorkerOptions o;
  o.router = absl::GetFlag(FLAGS_router);
  o.advertise_host = absl::GetFlag(FLAGS_advertise_host);
  o.transport = absl::GetFlag(FLAGS_transport);
  return o;
}

}  // namespace moesh
