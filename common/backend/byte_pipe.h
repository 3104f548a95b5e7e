// A byte pipe between two processes: whole messages, in order, each way,
// whose sizes the two sides agree on elsewhere (the nccl transport sends
// them over its gRPC stream first, so no side waits on the GPU for a message
// that is not coming). common/cuda_backend/nccl_pipe.h implements it over an
// NCCL link (in the CUDA plugin); nccl_transport.cc uses it without linking
// CUDA.
//
// Thread-safety: one sender and one receiver at a time; Abort from any
// thread at any time.
#ifndef MOESH_COMMON_BACKEND_BYTE_PIPE_H_
#define MOESH_COMMON_BACKEND_BYTE_PIPE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

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
  // Breaks the pipe: blocked and later calls fail with UNAVAILABLE; work
  // already enqueued on the pipe's GPU stream is cut short.
  virtual void Abort() = 0;

  // Device-resident transfers (the nccl pipe; UNIMPLEMENTED elsewhere),
  // ordered with the Send/Recv above on the pipe's own GPU stream: sends each of `sends`, then
  // receives into each of `recvs` (device buffers of the pipe's GPU; both
  // sides list the same sizes in the same order), then records cudaEvent_t
  // `done` (if not null). Returns once the transfers are enqueued. `after`:
  // cudaEvent_t's the transfers wait for (null entries skipped).
  struct DeviceBuffer {
    void* data;
    size_t bytes;
  };
  virtual absl::Status Exchange(absl::Span<const DeviceBuffer> sends,
                                absl::Span<const DeviceBuffer> recvs, absl::Span<void* const> after,
                                void* done, absl::Time deadline);
  // Returns once everything enqueued on the pipe's stream is done; errors
  // as for Send.
  virtual absl::Status Drain(absl::Time deadline);
};

inline absl::Status BytePipe::Exchange(absl::Span<const DeviceBuffer>,
                                       absl::Span<const DeviceBuffer>, absl::Span<void* const>,
                                       void*, absl::Time) {
  return absl::UnimplementedError("this byte pipe moves no device buffers");
}
inline absl::Status BytePipe::Drain(absl::Time) { return absl::OkStatus(); }

}  // namespace moesh

#endif  // MOESH_COMMON_BACKEND_BYTE_PIPE_H_
