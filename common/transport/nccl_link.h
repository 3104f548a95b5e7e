// An NCCL point-to-point link between two processes (or threads) on two
// GPUs: the piece the nccl transport is built from. Rank 0 makes the unique
// id, it travels to rank 1 over gRPC (as bytes: UniqueIdToBytes), both
// create the link, then move device buffers with Send/Recv on a stream.
//
// RAII: the communicator is destroyed with the link. Errors are Statuses
// carrying ncclGetErrorString / cudaGetErrorString; nothing here exits.
// NCCL refuses two ranks on one GPU: the cross-GPU run is the multi-GPU
// issue's; here setup, teardown and the error paths are what is tested.
#ifndef MOESH_COMMON_TRANSPORT_NCCL_LINK_H_
#define MOESH_COMMON_TRANSPORT_NCCL_LINK_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace moesh {

absl::StatusOr<ncclUniqueId> NewNcclUniqueId();
std::string UniqueIdToBytes(const ncclUniqueId& id);
// INVALID_ARGUMENT unless `bytes` is exactly one id.
absl::StatusOr<ncclUniqueId> UniqueIdFromBytes(const std::string& bytes);

class NcclLink {
 public:
  // Joins the 2-rank communicator `id` as `rank` (0 or 1) on CUDA `device`.
  // Blocks until the peer joins. FAILED_PRECONDITION without a usable GPU.
  static absl::StatusOr<std::unique_ptr<NcclLink>> Create(const ncclUniqueId& id, int rank, int device);
  ~NcclLink();
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;

  int rank() const { return rank_; }
  int device() const { return device_; }
  // Stream-ordered transfers of `bytes` device bytes to / from the peer.
  absl::Status Send(const void* device_buffer, size_t bytes, cudaStream_t stream);
  absl::Status Recv(void* device_buffer, size_t bytes, cudaStream_t stream);

 private:
  NcclLink(ncclComm_t comm, int rank, int device) : comm_(comm), rank_(rank), device_(device) {}
  ncclComm_t comm_;
  const int rank_;
  const int device_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_NCCL_LINK_H_
