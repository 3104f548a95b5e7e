// NcclPipe: a BytePipe over an NcclLink between two GPUs. A message's bytes
// are staged host → device on the sender and device → host on the receiver
// (pinned buffers, one stream), so they cross between the GPUs over
// NVLink/PCIe peer access, not through sockets. Empty messages move nothing.
// Built into the CUDA plugin (libmoesh_cuda_backends.so).
//
// Device buffers (Exchange) move GPU to GPU with no staging.
//
// Thread-safety: BytePipe's (one sender, one receiver at a time; the two
// directions share the link's stream, so not concurrently either).
#ifndef MOESH_COMMON_CUDA_BACKEND_NCCL_PIPE_H_
#define MOESH_COMMON_CUDA_BACKEND_NCCL_PIPE_H_

#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/backend/byte_pipe.h"
#include "common/cuda_backend/nccl_link.h"

namespace moesh {

class NcclPipe : public BytePipe {
 public:
  // Joins the 2-rank communicator `unique_id` (UniqueIdToBytes) as `rank` on
  // CUDA `device`, waiting for the peer until `deadline`.
  static absl::StatusOr<std::unique_ptr<NcclPipe>> Open(const std::string& unique_id, int rank,
                                                        int device, absl::Time deadline);
  ~NcclPipe() override;

  absl::Status Send(const std::string& bytes, absl::Time deadline) override;
  absl::StatusOr<std::string> Recv(size_t bytes, absl::Time deadline) override;
  void Abort() override { link_->Abort(); }
  absl::Status Exchange(absl::Span<const DeviceBuffer> sends, absl::Span<const DeviceBuffer> recvs,
                        absl::Span<void* const> after, void* done, absl::Time deadline) override;
  absl::Status Drain(absl::Time deadline) override;

 private:
  NcclPipe(std::unique_ptr<NcclLink> link, cudaStream_t stream)
      : link_(std::move(link)), stream_(stream) {}
  // Grows the staging buffers to at least `bytes`.
  absl::Status Reserve(size_t bytes);

  std::unique_ptr<NcclLink> link_;
  cudaStream_t stream_;
  absl::Mutex mu_;  // one transfer at a time over the shared stream and buffers
  void* device_ = nullptr;
  char* host_ = nullptr;  // pinned
  size_t capacity_ = 0;
};

}  // namespace moesh

#endif  // MOESH_COMMON_CUDA_BACKEND_NCCL_PIPE_H_
