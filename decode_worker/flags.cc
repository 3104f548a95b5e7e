#include "decode_worker/flags.h"

#include "absl/flags/flag.h"
#include "base/status.h"
#include "common/service/group_flags.h"

ABSL_FLAG(int, micro_batch_min, moesh::DecodeWorkerOptions().micro_batch_min,
          "Smallest decode batch that is split into --micro_batches.");

namespace moesh {

absl::StatusOr<DecodeWorkerOptions> DecodeWorkerOptionsFromFlags() {
  DecodeWorkerOptions o;
  RETURN_IF_ERROR(ReadFlagGroups(&o.server, &o.worker, &o.dispatch, &o.kv, &o.device));
  o.micro_batch_min = absl::GetFlag(FLAGS_micro_batch_min);
  if (o.kv.kv_blocks < 1 || o.kv.block_size < 1 || o.kv.max_batch < 1) {
    return absl::InvalidArgumentError("--kv_blocks, --block_size and --max_batch must be >= 1");
  }
  if (o.kv.max_waiting_requests < 0)
    return absl::InvalidArgumentError("--max_waiting_requests must be >= 0");
  return o;
}

}  // namespace moesh
