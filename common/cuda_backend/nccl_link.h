// An NCCL point-to-point link between two processes (or threads) on two
// GPUs: the piece the nccl transport is built from. Rank 0 makes the unique
// id, it travels to rank 1 over gRPC (as bytes: UniqueIdToBytes), both
// create the link, then move device buffers with Send/Recv on a stream.
//
// RAII: the communicator is destroyed with the link. Errors are Statuses
// carrying ncclGetErrorString / cudaGetErrorString; nothing here exits.
// NCCL refuses two ranks on one GPU: the cross-GPU run is the multi-GPU
// issue's; here setup, teardown and the error paths are what is tested.
#ifndef MOESH_COMMON_CUDA_BACKEND_NCCL_LINK_H_
#define MOESH_COMMON_CUDA_BACKEND_NCCL_LINK_H_

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace moesh {

absl::StatusOr<ncclUniqueId> NewNcclUniqueId();
std::string UniqueIdToBytes(const ncclUniqueId& id);
// INVALID_ARGUMENT unless `bytes` is exactly one id.
absl::StatusOr<ncclUniqueId> UniqueIdFromBytes(const std::string& bytes);

// The communicator is blocking (each operation is launched by the calling
// thread), but nothing waits for the peer without a deadline: Create joins
// and connects both directions under one, and every wait polls the
// asynchronous error and gives up at a deadline (a peer that died never
// answers), aborting the communicator; after that every call fails with
// UNAVAILABLE.
class NcclLink {
 public:
  // Joins the 2-rank communicator `id` as `rank` (0 or 1) on CUDA `device`
  // and connects to the peer both ways, waiting for it until `deadline`
  // (DEADLINE_EXCEEDED; a helper thread still joining then lets go).
  // FAILED_PRECONDITION without a usable GPU.
  static absl::StatusOr<std::unique_ptr<NcclLink>> Create(
      const ncclUniqueId& id, int rank, int device, absl::Time deadline = absl::InfiniteFuture());
  ~NcclLink();  // aborts the communicator (local, never waits for the peer)
  NcclLink(const NcclLink&) = delete;
  NcclLink& operator=(const NcclLink&) = delete;

  int rank() const { return rank_; }
  int device() const { return device_; }
  // Stream-ordered transfers of `bytes` device bytes to / from the peer.
  // Returns once NCCL accepted the operation (a non-blocking communicator
  // takes no next call before that; connecting to the peer happens here on
  // first use), polling until `deadline`.
  absl::Status Send(const void* device_buffer, size_t bytes, cudaStream_t stream,
                    absl::Time deadline = absl::InfiniteFuture());
  absl::Status Recv(void* device_buffer, size_t bytes, cudaStream_t stream,
                    absl::Time deadline = absl::InfiniteFuture());
  // Sends and receives as one NCCL group (one kernel): each {buffer, bytes}
  // of `sends`, then each of `recvs`, in order.
  struct Buffer {
    void* data;
    size_t bytes;
  };
  absl::Status Group(const Buffer* sends, size_t num_sends, const Buffer* recvs, size_t num_recvs,
                     cudaStream_t stream, absl::Time deadline = absl::InfiniteFuture());
  // Waits until `stream`'s work is done: DEADLINE_EXCEEDED past `deadline`,
  // UNAVAILABLE on an NCCL error or Abort (the communicator is then aborted).
  absl::Status Wait(cudaStream_t stream, absl::Time deadline);
  // Aborts the communicator now (operations still on a stream end), making
  // a Wait in progress and every later call fail. Any thread.
  void Abort();

 private:
  NcclLink(ncclComm_t comm, int rank, int device) : comm_(comm), rank_(rank), device_(device) {}
  // Polls the communicator until it leaves ncclInProgress.
  absl::Status Settle(const char* what, absl::Time deadline);
  // Runs `op` (ncclSend / ncclRecv / a group) on a live link and waits until NCCL took it.
  absl::Status Post(const char* what, const std::function<ncclResult_t()>& op, absl::Time deadline);
  absl::Status Broken(absl::Status why);  // aborts once, returns why
  // The communicator's asynchronous state; an error once aborted. Takes mu_
  // (the communicator is freed by an abort from another thread).
  ncclResult_t AsyncState(ncclResult_t* state);
  ncclComm_t comm_;  // used under mu_ once the link exists
  const int rank_;
  const int device_;
  std::atomic<bool> abort_requested_{false};
  absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace moesh

#endif  // MOESH_COMMON_CUDA_BACKEND_NCCL_LINK_H_
