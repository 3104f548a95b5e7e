// The expert worker's command line: its options, read from its flags
// (flags.cc, the binary's only flag definitions besides common/service's
// groups), and rendered back into flags (flag_args.cc) for whoever starts one.
#ifndef MOESH_EXPERT_WORKER_FLAGS_H_
#define MOESH_EXPERT_WORKER_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/backends.h"
#include "common/service/server_flags.h"
#include "common/service/worker_flags.h"

namespace moesh {

// The defaults are the flags' defaults.
struct ExpertWorkerOptions {
  ServerOptions server;
  WorkerOptions worker;
  DeviceOptions device;  // the device flags' fields
  // The experts to host: a list ("0-31,40"), else the i-th of n shards
  // ("i/n"), else all of them.
  std::string experts;
  std::string shard;
  int batch_window_us = 200;
};

// INVALID_ARGUMENT for a missing --model or a bad device.
absl::StatusOr<ExpertWorkerOptions> ExpertWorkerOptionsFromFlags();
// The command line that gives moesh_expert_worker `o` (flags at their
// defaults left out).
std::vector<std::string> ToArgs(const ExpertWorkerOptions& o);

}  // namespace moesh

#endif  // MOESH_EXPERT_WORKER_FLAGS_H_
