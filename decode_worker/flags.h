// The decode worker's command line: its options, read from its flags
// (flags.cc, the binary's only flag definitions besides common/service's
// groups), and rendered back into flags (flag_args.cc) for whoever starts one.
#ifndef MOESH_DECODE_WORKER_FLAGS_H_
#define MOESH_DECODE_WORKER_FLAGS_H_

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
struct DecodeWorkerOptions {
  ServerOptions server;
  WorkerOptions worker;
  ExpertDispatchOptions dispatch;
  KvOptions kv;
  DeviceOptions device;      // the device flags' fields; the KV pool's come from `kv`
  int micro_batch_min = 16;  // the smallest batch split into micro-batches
  // --max_pending_kv_share: the share of the KV pool, (0, 1], one peer's
  // reservations awaiting their KV may hold (DecodeEngineOptions); 1: no cap
  // (the default: admission queues, so a single router's prompts awaiting
  // their KV may fill the pool; mTLS keeps other peers out).
  double max_pending_kv_share = 1.0;
};

// INVALID_ARGUMENT for a missing --model, a bad device, a count below 1 or a
// share outside (0, 1].
absl::StatusOr<DecodeWorkerOptions> DecodeWorkerOptionsFromFlags();
// The command line that gives moesh_decode_worker `o` (flags at their
// defaults left out).
std::vector<std::string> ToArgs(const DecodeWorkerOptions& o);

}  // namespace moesh

#endif  // MOESH_DECODE_WORKER_FLAGS_H_
