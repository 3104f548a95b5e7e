// The flags the attention workers (prefill and decode) share: where their
// MoE layers' routed experts are, and how their dispatches overlap.
#ifndef MOESH_COMMON_SERVICE_DISPATCH_FLAGS_H_
#define MOESH_COMMON_SERVICE_DISPATCH_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moesh {

// The defaults are the flags' defaults (dispatch_flags.cc).
struct ExpertDispatchOptions {
  // --expert_workers: expert worker addresses (empty: the router's placement
  // map, or every expert in this process without --router).
  std::vector<std::string> expert_workers;
  int expert_discovery_timeout_s = 600;  // --expert_discovery_timeout_s
  int micro_batches = 2;                 // --micro_batches (1: no ping-pong)
  // --dispatch_dtype: how host dispatches to the expert workers travel where
  // the transport carries them as messages (grpc, ucx, nccl's host calls):
  // fp32, bf16 or fp8 (ParseDispatchDType, common/transport/dispatch_wire.h).
  std::string dispatch_dtype = "fp32";
};

// --expert_workers, --expert_discovery_timeout_s, --micro_batches,
// --dispatch_dtype; INVALID_ARGUMENT for a timeout below 0, fewer than 1
// micro-batch or a dispatch dtype not fp32, bf16 or fp8.
absl::StatusOr<ExpertDispatchOptions> ExpertDispatchOptionsFromFlags();
// The flags that set `o` (flag_args.cc).
void AppendArgs(const ExpertDispatchOptions& o, std::vector<std::string>* args);

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_DISPATCH_FLAGS_H_
