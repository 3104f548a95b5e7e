// What a device channel (nccl, cuda_ipc) keeps of the one device-resident
// dispatch it has in flight, from DataChannel::Post to Collect. Not
// thread-safe: the channel's lock guards it.
#ifndef MOESH_COMMON_TRANSPORT_POSTED_DISPATCH_H_
#define MOESH_COMMON_TRANSPORT_POSTED_DISPATCH_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/model/moe_dispatch.h"

namespace moesh {

// Post's first check: OK iff `d` lies in CUDA device `device`'s memory (the
// channel's); else UNIMPLEMENTED naming `peer` (host dispatches go whole
// through DataChannel::Dispatch).
inline absl::Status CheckPostable(const MoeDispatch& d, int device, const std::string& peer) {
  if (d.memory == DispatchMemory::CudaDevice(device)) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "data plane to ", peer, ": Post takes ", DispatchMemory::CudaDevice(device).ToString(),
      " dispatches, not ", d.memory.ToString(), " (host memory: Dispatch)"));
}

struct PostedDispatch {
  int tokens = -1;  // rows; -1: none in flight
  int hidden = 0;
  void* stream = nullptr;  // the caller's (null: collected synchronously)
  // cuda_ipc, nonzero: pipelined on the caller's stream, the value the
  // `done` word takes.
  uint32_t sync_value = 0;

  bool in_flight() const { return tokens >= 0; }
  // Post's check: FAILED_PRECONDITION while a dispatch is in flight.
  absl::Status CheckNoneInFlight() const {
    if (in_flight()) {
      return absl::FailedPreconditionError("a device dispatch is already in flight here");
    }
    return absl::OkStatus();
  }
  // Collect's: the dispatch in flight, leaving none;
  // FAILED_PRECONDITION without one.
  absl::StatusOr<PostedDispatch> Take() {
    if (!in_flight()) return absl::FailedPreconditionError("Collect without Post");
    return std::exchange(*this, PostedDispatch());
  }
};

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_POSTED_DISPATCH_H_
