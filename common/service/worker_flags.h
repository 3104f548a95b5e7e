// The flags the workers (prefill, decode and expert) share: the router they
// register with, the host they advertise, and the data plane between
// attention and expert workers.
#ifndef MOESH_COMMON_SERVICE_WORKER_FLAGS_H_
#define MOESH_COMMON_SERVICE_WORKER_FLAGS_H_

#include <string>
#include <vector>

namespace moesh {

// The defaults are the flags' defaults (worker_flags.cc).
struct WorkerOptions {
  std::string router;  // --router: the routers' cluster host:port, comma-separated (empty: none)
  std::string advertise_host = "127.0.0.1";  // --advertise_host
  std::string transport = "grpc";            // --transport: grpc, ucx, nccl or cuda_ipc
};

// --router, --advertise_host, --transport.
WorkerOptions WorkerOptionsFromFlags();
// The flags that set `o` (flag_args.cc).
void AppendArgs(const WorkerOptions& o, std::vector<std::string>* args);

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_WORKER_FLAGS_H_
