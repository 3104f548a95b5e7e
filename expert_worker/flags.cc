#include "expert_worker/flags.h"

#include "absl/flags/flag.h"
#include "base/status.h"
#include "common/service/group_flags.h"

ABSL_FLAG(std::string, experts, moesh::ExpertWorkerOptions().experts,
          "Experts to host, e.g. \"0-31\" (default: all, or --shard).");
ABSL_FLAG(std::string, shard, moesh::ExpertWorkerOptions().shard,
          "Host the i-th of n equal shards of the experts: \"i/n\".");
ABSL_FLAG(int, batch_window_us, moesh::ExpertWorkerOptions().batch_window_us,
          "How long a layer's first dispatch waits for other attention workers' dispatches to "
          "merge with it (skipped while only one dispatches).");

namespace moesh {

absl::StatusOr<ExpertWorkerOptions> ExpertWorkerOptionsFromFlags() {
  ExpertWorkerOptions o;
  RETURN_IF_ERROR(ReadFlagGroups(&o.server, &o.worker, &o.device));
  o.experts = absl::GetFlag(FLAGS_experts);
  o.shard = absl::GetFlag(FLAGS_shard);
  o.batch_window_us = absl::GetFlag(FLAGS_batch_window_us);
  return o;
}

}  // namespace moesh
