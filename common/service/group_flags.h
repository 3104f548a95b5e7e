// A service's flag groups (common/service/*_flags.h) read at once, the start
// of its ...OptionsFromFlags():
//   RETURN_IF_ERROR(ReadFlagGroups(&o.server, &o.worker, &o.device));
// Header only, so a binary still links (and accepts) only the groups it reads.
#ifndef MOESH_COMMON_SERVICE_GROUP_FLAGS_H_
#define MOESH_COMMON_SERVICE_GROUP_FLAGS_H_

#include "absl/status/status.h"
#include "base/status.h"
#include "common/service/device_flags.h"
#include "common/service/dispatch_flags.h"
#include "common/service/kv_flags.h"
#include "common/service/server_flags.h"
#include "common/service/worker_flags.h"

namespace moesh {
namespace group_flags_internal {

inline absl::Status Read(ServerOptions* o) {
  ASSIGN_OR_RETURN(*o, ServerOptionsFromFlags());
  return absl::OkStatus();
}
inline absl::Status Read(WorkerOptions* o) {
  *o = WorkerOptionsFromFlags();
  return absl::OkStatus();
}
inline absl::Status Read(ExpertDispatchOptions* o) {
  ASSIGN_OR_RETURN(*o, ExpertDispatchOptionsFromFlags());
  return absl::OkStatus();
}
inline absl::Status Read(KvOptions* o) {
  ASSIGN_OR_RETURN(*o, KvOptionsFromFlags());
  return absl::OkStatus();
}
inline absl::Status Read(DeviceOptions* o) {
  ASSIGN_OR_RETURN(*o, DeviceOptionsFromFlags());
  return absl::OkStatus();
}

}  // namespace group_flags_internal

// Reads each group's flags into it (its ...FromFlags()), in order, up to the
// first error, which it returns.
template <typename... Groups>
absl::Status ReadFlagGroups(Groups*... groups) {
  absl::Status status;
  (void)((status = group_flags_internal::Read(groups)).ok() && ...);
  return status;
}

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_GROUP_FLAGS_H_
