// ExpertWorkerOptions as flags; no flag is defined here (flags.cc does).
#include "common/service/flag_args.h"

#include "common/service/device_flags.h"
#include "expert_worker/flags.h"

namespace moesh {

std::vector<std::string> ToArgs(const ExpertWorkerOptions& o) {
  const ExpertWorkerOptions d;
  std::vector<std::string> args = GroupArgs(o.server, o.worker, o.device);
  AddFlag(&args, "experts", o.experts, d.experts);
  AddFlag(&args, "shard", o.shard, d.shard);
  AddFlag(&args, "batch_window_us", o.batch_window_us, d.batch_window_us);
  return args;
}

}  // namespace moesh
