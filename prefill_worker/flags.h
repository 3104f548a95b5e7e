// The prefill worker's command line: its options, read from its flags
// (flags.cc, the binary's only flag definitions besides common/service's
// groups), and rendered back into flags (flag_args.cc) for whoever starts one.
#ifndef MOESH_PREFILL_WORKER_FLAGS_H_
#define MOESH_PREFILL_WORKER_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/backends.h"
#include "common/service/dispatch_flags.h"
#include "common/service/server_flags.h"
#include "common/service/worker_flags.h"

namespace moesh {

// The defaults are the flags' defaults.
struct PrefillWorkerOptions {
  ServerOptions server;
  WorkerOptions worker;
  ExpertDispatchOptions dispatch;
  DeviceOptions device;  // the device flags' fields; the KV pool's at their defaults
  int max_batch_tokens = 8192;
  // How the KV cache reaches decode workers: auto, host or device.
  std::string kv_handoff = "auto";
};

// INVALID_ARGUMENT for a missing --model, a bad device, --kv_handoff other
// than auto/host/device, or a count below 1.
absl::StatusOr<PrefillWorkerOptions> PrefillWorkerOptionsFromFlags();
// The command line that gives moesh_prefill_worker `o` (flags at their
// defaults left out).
std::vector<std::string> ToArgs(const PrefillWorkerOptions& o);

}  // namespace moesh

#endif  // MOESH_PREFILL_WORKER_FLAGS_H_
