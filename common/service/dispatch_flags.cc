#include "common/service/dispatch_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "common/transport/dispatch_wire.h"

ABSL_FLAG(std::string, expert_workers,
          absl::StrJoin(moesh::ExpertDispatchOptions().expert_workers, ","),
          "Comma-separated expert worker addresses (empty: the router's placement map, followed "
          "as it changes; without --router, every expert loaded in this process).");
ABSL_FLAG(int, expert_discovery_timeout_s,
          moesh::ExpertDispatchOptions().expert_discovery_timeout_s,
          "How long to wait at startup until expert workers cover every expert.");
ABSL_FLAG(int, micro_batches, moesh::ExpertDispatchOptions().micro_batches,
          "Ping-pong micro-batches with remote experts: one micro-batch's attention runs while "
          "another's experts do; per forward pass (prefill) or decode step (decode); 1: off.");
ABSL_FLAG(std::string, dispatch_dtype, moesh::ExpertDispatchOptions().dispatch_dtype,
          "How the hidden states of expert dispatches travel to the expert workers over the host "
          "wire (grpc, ucx, nccl's host calls): fp32 (exact), bf16 (both ways), or fp8 (e4m3 with "
          "a float32 scale per token per 128 channels, DeepEP's FP8 dispatch; answers in bf16). "
          "Device-memory dispatches (nccl, cuda_ipc) move bf16 as they are.");

namespace moesh {

absl::StatusOr<ExpertDispatchOptions> ExpertDispatchOptionsFromFlags() {
  ExpertDispatchOptions o;
  o.expert_workers =
      absl::StrSplit(absl::GetFlag(FLAGS_expert_workers), ',', absl::SkipWhitespace());
  o.expert_discovery_timeout_s = absl::GetFlag(FLAGS_expert_discovery_timeout_s);
  o.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  o.dispatch_dtype = absl::GetFlag(FLAGS_dispatch_dtype);
  if (o.expert_discovery_timeout_s < 0) {
    return absl::InvalidArgumentError("--expert_discovery_timeout_s must be >= 0");
  }
  if (o.micro_batches < 1) return absl::InvalidArgumentError("--micro_batches must be >= 1");
  RETURN_IF_ERROR(ParseDispatchDType(o.dispatch_dtype).status());
  return o;
}

}  // namespace moesh
