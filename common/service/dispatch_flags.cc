#include "common/service/dispatch_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

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

namespace moesh {

absl::StatusOr<ExpertDispatchOptions> ExpertDispatchOptionsFromFlags() {
  ExpertDispatchOptions o;
  o.expert_workers =
      absl::StrSplit(absl::GetFlag(FLAGS_expert_workers), ',', absl::SkipWhitespace());
  o.expert_discovery_timeout_s = absl::GetFlag(FLAGS_expert_discovery_timeout_s);
  o.micro_batches = absl::GetFlag(FLAGS_micro_batches);
  if (o.expert_discovery_timeout_s < 0) {
    return absl::InvalidArgumentError("--expert_discovery_timeout_s must be >= 0");
  }
  if (o.micro_batches < 1) return absl::InvalidArgumentError("--micro_batches must be >= 1");
  return o;
}

}  // namespace moesh
