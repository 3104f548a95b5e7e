// A byte pipe between two processes: whole messages, in order, each way,
// whose sizes the two sides agree on elsewhere (the nccl transport sends
// them over its gRPC stream first, so no side waits on the GPU for a message
// that is not coming). common/transport/nccl_pipe.h implements it over an
// NCCL link (in the CUDA plugin); nccl_transport.cc uses it without linking
// CUDA.
//
// Thread-safety: one sender and one receiver at a time; Abort from any
// thread at any time.
#ifndef MOESH_COMMON_TRANSPORT_BYTE_PIPE_H_
#define MOESH_COMMON_TRANSPORT_BYTE_PIPE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace moesh {

class BytePipe {
 public:
  virtual ~BytePipe() = default;
  // Returns once the message left (the peer need not have read it yet).
  // DEADLINE_EXCEEDED past `deadline`, UNAVAILABLE if the pipe broke or was
  // aborted; either way the pipe is broken for good.
  virtual absl::Status Send(const std::string& bytes, absl::Time deadline) = 0;
  // The next message, of `bytes` bytes (as the sender sent); the same errors.
  virtual absl::StatusOr<std::string> Recv(size_t bytes, absl::Time deadline) = 0;
  // Breaks the pipe: blocked and later calls fail with UNAVAILABLE.
  virtual void Abort() = 0;
};

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_BYTE_PIPE_H_
