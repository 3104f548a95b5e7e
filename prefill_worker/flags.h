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
#include "common/service/kv_flags.h"
#include "common/service/server_flags.h"
#include "common/service/worker_flags.h"

namespace moesh {

// The defaults are the flags' defaults.
struct PrefillWorkerOptions {
  ServerOptions server;
  WorkerOptions worker;
  ExpertDispatchOptions dispatch;
  DeviceOptions device;  // the device flags' fields; the KV pool's at their defaults
  // --kv_blocks, --block_size, --enable_prefix_caching: on --device cpu with
  // the prefix cache on, prompts' KV lives in a pool of kv_blocks blocks
  // whose full blocks stay cached for later prompts (only their uncached
  // suffix is computed); off, each prompt's cache lives for its pass alone.
  // --max_num_batched_tokens: the longest prompt chunk of a pass (chunked
  // prefill). max_batch and max_waiting_requests are the decode side's
  // (unused here).
  KvOptions kv;
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
