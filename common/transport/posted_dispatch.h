// What a device channel (nccl, cuda_ipc) keeps of the one device-resident
// dispatch it has in flight, from PostOnDevice to CollectOnDevice. Not
// thread-safe: the channel's lock guards it.
#ifndef MOESH_COMMON_TRANSPORT_POSTED_DISPATCH_H_
#define MOESH_COMMON_TRANSPORT_POSTED_DISPATCH_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moesh {

struct PostedDispatch {
  int tokens = -1;  // rows; -1: none in flight
  int hidden = 0;
  void* stream = nullptr;  // the caller's (null: collected synchronously)
  bool pipelined = false;  // cuda_ipc: ordered by events on the caller's stream

  bool in_flight() const { return tokens >= 0; }
  // PostOnDevice's check: FAILED_PRECONDITION while a dispatch is in flight.
  absl::Status CheckNoneInFlight() const {
    if (in_flight()) {
      return absl::FailedPreconditionError("a device dispatch is already in flight here");
    }
    return absl::OkStatus();
  }
  // CollectOnDevice's: the dispatch in flight, leaving none;
  // FAILED_PRECONDITION without one.
  absl::StatusOr<PostedDispatch> Take() {
    if (!in_flight()) return absl::FailedPreconditionError("CollectOnDevice without PostOnDevice");
    return std::exchange(*this, PostedDispatch());
  }
};

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_POSTED_DISPATCH_H_
