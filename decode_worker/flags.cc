#include "decode_worker/flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/service/group_flags.h"

ABSL_FLAG(int, micro_batch_min, moesh::DecodeWorkerOptions().micro_batch_min,
          "Smallest decode batch that is split into --micro_batches.");

ABSL_FLAG(double, max_pending_kv_share, moesh::DecodeWorkerOptions().max_pending_kv_share,
          "The share of the KV pool, (0, 1], that the prompt blocks of one peer's (host's) "
          "reservations still waiting for their KV may hold together; more fail "
          "RESOURCE_EXHAUSTED, so a flood of reservations from one caller leaves the rest to "
          "others (a peer with none pending may always reserve one request). 1: no cap.");

namespace moesh {

absl::StatusOr<DecodeWorkerOptions> DecodeWorkerOptionsFromFlags() {
  DecodeWorkerOptions o;
  RETURN_IF_ERROR(ReadFlagGroups(&o.server, &o.worker, &o.dispatch, &o.kv, &o.device));
  o.micro_batch_min = absl::GetFlag(FLAGS_micro_batch_min);
  o.max_pending_kv_share = absl::GetFlag(FLAGS_max_pending_kv_share);
  if (!(o.max_pending_kv_share > 0 && o.max_pending_kv_share <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_pending_kv_share must lie in (0, 1], got ", o.max_pending_kv_share));
  }
  if (o.kv.kv_blocks < 1 || o.kv.block_size < 1 || o.kv.max_batch < 1) {
    return absl::InvalidArgumentError("--kv_blocks, --block_size and --max_batch must be >= 1");
  }
  if (o.kv.max_waiting_requests < 0)
    return absl::InvalidArgumentError("--max_waiting_requests must be >= 0");
  return o;
}

}  // namespace moesh
