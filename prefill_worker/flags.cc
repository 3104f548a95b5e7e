#include "prefill_worker/flags.h"

#include "absl/flags/flag.h"
#include "base/status.h"
#include "common/service/group_flags.h"

ABSL_FLAG(int, max_batch_tokens, moesh::PrefillWorkerOptions().max_batch_tokens,
          "Prompt tokens per forward pass.");
ABSL_FLAG(std::string, kv_handoff, moesh::PrefillWorkerOptions().kv_handoff,
          "How the KV cache reaches decode workers: host (rows in the message), device (the "
          "decode worker copies it from this worker's GPU memory; --transport cuda_ipc or nccl "
          "and --device cuda, workers on one node), or auto (device where those hold, else host; "
          "a decode worker that cannot map this GPU's memory gets the host form from then on).");

namespace moesh {

absl::StatusOr<PrefillWorkerOptions> PrefillWorkerOptionsFromFlags() {
  PrefillWorkerOptions o;
  RETURN_IF_ERROR(ReadFlagGroups(&o.server, &o.worker, &o.dispatch, &o.kv, &o.device));
  if (o.kv.enable_prefix_caching && (o.kv.kv_blocks < 1 || o.kv.block_size < 1)) {
    return absl::InvalidArgumentError(
        "--kv_blocks and --block_size must be >= 1 with --enable_prefix_caching");
  }
  o.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  if (o.max_batch_tokens < 1) return absl::InvalidArgumentError("--max_batch_tokens must be >= 1");
  o.kv_handoff = absl::GetFlag(FLAGS_kv_handoff);
  if (o.kv_handoff != "auto" && o.kv_handoff != "host" && o.kv_handoff != "device") {
    return absl::InvalidArgumentError("--kv_handoff: auto, host or device, got " + o.kv_handoff);
  }
  return o;
}

}  // namespace moesh
