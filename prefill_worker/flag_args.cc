// PrefillWorkerOptions as flags; no flag is defined here (flags.cc does).
#include "common/service/flag_args.h"

#include "common/service/device_flags.h"
#include "prefill_worker/flags.h"

namespace moesh {

std::vector<std::string> ToArgs(const PrefillWorkerOptions& o) {
  const PrefillWorkerOptions d;
  std::vector<std::string> args = GroupArgs(o.server, o.worker, o.dispatch, o.kv, o.device);
  AddFlag(&args, "max_batch_tokens", o.max_batch_tokens, d.max_batch_tokens);
  AddFlag(&args, "kv_handoff", o.kv_handoff, d.kv_handoff);
  return args;
}

}  // namespace moesh
