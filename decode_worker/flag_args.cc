// DecodeWorkerOptions as flags; no flag is defined here (flags.cc does).
#include "common/service/flag_args.h"

#include "common/service/device_flags.h"
#include "decode_worker/flags.h"

namespace moesh {

std::vector<std::string> ToArgs(const DecodeWorkerOptions& o) {
  const DecodeWorkerOptions d;
  std::vector<std::string> args = GroupArgs(o.server, o.worker, o.dispatch, o.kv, o.device);
  AddFlag(&args, "micro_batch_min", o.micro_batch_min, d.micro_batch_min);
  AddFlag(&args, "max_pending_kv_share", o.max_pending_kv_share, d.max_pending_kv_share);
  return args;
}

}  // namespace moesh
