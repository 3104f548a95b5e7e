#include "common/cuda_backend/nccl_link.h"

#include <cstring>
#include <functional>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace moesh {
namespace {

absl::Status NcclError(const char* what, ncclResult_t r) {
  return absl::UnavailableError(absl::StrCat("NCCL ", what, ": ", ncclGetErrorString(r)));
}

}  // namespace

absl::StatusOr<ncclUniqueId> NewNcclUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return NcclError("unique id", r);
  return id;
}

std::string UniqueIdToBytes(const ncclUniqueId& id) {
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::StatusOr<ncclUniqueId> UniqueIdFromBytes(const std::string& bytes) {
  if (bytes.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError(
        absl::StrCat("an NCCL unique id is ", sizeof(ncclUniqueId), " bytes, got ", bytes.size()));
  }
  ncclUniqueId id;
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

absl::StatusOr<std::unique_ptr<NcclLink>> NcclLink::Create(const ncclUniqueId& id, int rank,
                                                           int device, absl::Time deadline) {
  if (rank != 0 && rank != 1)
    return absl::InvalidArgumentError(absl::StrCat("rank must be 0 or 1, got ", rank));
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return absl::FailedPreconditionError("NCCL link: no CUDA device on this machine");
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " does not exist (", count, " present)"));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cudaSetDevice: ", cudaGetErrorString(e)));
  }
  // A blocking communicator: each group is launched by the calling thread
  // (a non-blocking one starts a thread per group, ~50 us an operation).
  // What can wait for the peer — joining, and connecting to it — happens
  // here, on a helper thread the caller waits for until `deadline`; past it
  // the communicator is aborted (which ends the helper's wait) and the
  // helper lets go of it. Later operations only enqueue kernels; a dead peer
  // is found by Wait (the deadline, the asynchronous error) and Abort.
  struct Joining {
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    bool abandoned ABSL_GUARDED_BY(mu) = false;
    ncclComm_t comm ABSL_GUARDED_BY(mu) = nullptr;  // once created
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  auto joining = std::make_shared<Joining>();
  std::thread([joining, id, rank, device] {
    cudaSetDevice(device);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, /*nranks=*/2, id, rank, &config);
    {
      absl::MutexLock lock(&joining->mu);
      if (r != ncclSuccess) {
        joining->status = NcclError("communicator init", r);
        joining->done = true;
        return;
      }
      if (joining->abandoned) {
        ncclCommAbort(comm);
        return;
      }
      joining->comm = comm;  // from here the caller may abort it
    }
    // Connect both directions in one round: NCCL sets up the connections to
    // a peer lazily, at the first group using them, and both ranks must set
    // up the same ones together (a receive-only group on one side against a
    // send and receive group on the other fails in NCCL's bootstrap).
    void* scratch = nullptr;
    cudaStream_t stream = nullptr;
    absl::Status s = absl::OkStatus();
    if (cudaMalloc(&scratch, 512) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
      s = absl::ResourceExhaustedError("NCCL link: no memory for the connection round");
    }
    if (s.ok()) {
      ncclGroupStart();
      ncclResult_t a = ncclSend(scratch, 1, ncclUint8, 1 - rank, comm, stream);
      ncclResult_t b =
          ncclRecv(static_cast<char*>(scratch) + 256, 1, ncclUint8, 1 - rank, comm, stream);
      r = ncclGroupEnd();
      if (a != ncclSuccess || b != ncclSuccess || r != ncclSuccess) {
        s = NcclError("connecting to the peer", r != ncclSuccess ? r : (a != ncclSuccess ? a : b));
      }
    }
    if (s.ok() && cudaStreamSynchronize(stream) != cudaSuccess) {
      s = absl::UnavailableError("NCCL link: the connection round failed");
    }
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (scratch != nullptr) cudaFree(scratch);
    absl::MutexLock lock(&joining->mu);
    if (joining->abandoned) return;  // the caller aborted the communicator
    if (!s.ok()) {
      ncclCommAbort(comm);
      joining->comm = nullptr;
    }
    joining->status = s;
    joining->done = true;
  }).detach();
  absl::MutexLock lock(&joining->mu);
  auto done = [&joining]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(joining->mu) { return joining->done; };
  joining->mu.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (!joining->done) {
    joining->abandoned = true;
    if (joining->comm != nullptr)
      ncclCommAbort(joining->comm);  // ends the helper's wait on the peer
    return absl::DeadlineExceededError(
        "NCCL communicator init: the peer did not join and connect in time");
  }
  if (!joining->status.ok()) return joining->status;
  return std::unique_ptr<NcclLink>(new NcclLink(joining->comm, rank, device));
}

NcclLink::~NcclLink() {
  cudaSetDevice(device_);
  absl::MutexLock lock(&mu_);
  if (!aborted_) ncclCommAbort(comm_);  // local; ncclCommDestroy could wait for a dead peer
}

void NcclLink::Abort() {
  abort_requested_.store(true);
  Broken(absl::OkStatus()).IgnoreError();
}

absl::Status NcclLink::Broken(absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (!aborted_) {
    cudaSetDevice(device_);
    ncclCommAbort(comm_);
    aborted_ = true;
  }
  return why;
}

ncclResult_t NcclLink::AsyncState(ncclResult_t* state) {
  absl::MutexLock lock(&mu_);
  if (aborted_) {
    *state = ncclInvalidUsage;
    return ncclSuccess;
  }
  return ncclCommGetAsyncError(comm_, state);
}

absl::Status NcclLink::Settle(const char* what, absl::Time deadline) {
  int spins = 0;
  while (true) {
    if (abort_requested_.load())
      return Broken(absl::UnavailableError(absl::StrCat("NCCL ", what, ": aborted")));
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = AsyncState(&state);
    if (r != ncclSuccess) return Broken(NcclError(what, r));
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return Broken(NcclError(what, state));
    if (absl::Now() > deadline) {
      return Broken(absl::DeadlineExceededError(
          absl::StrCat("NCCL ", what, ": the peer did not answer in time")));
    }
    if (++spins > 2000)
      std::this_thread::sleep_for(std::chrono::microseconds(spins > 20000 ? 200 : 20));
  }
}

absl::Status NcclLink::Post(const char* what, const std::function<ncclResult_t()>& op,
                            absl::Time deadline) {
  ncclResult_t r;
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return absl::UnavailableError("NCCL link: aborted");
    cudaSetDevice(device_);
    r = op();
  }
  if (r != ncclSuccess && r != ncclInProgress) return Broken(NcclError(what, r));
  return r == ncclInProgress ? Settle(what, deadline) : absl::OkStatus();
}

absl::Status NcclLink::Send(const void* buf, size_t bytes, cudaStream_t stream,
                            absl::Time deadline) {
  return Post(
      "send", [&] { return ncclSend(buf, bytes, ncclUint8, 1 - rank_, comm_, stream); }, deadline);
}

absl::Status NcclLink::Recv(void* buf, size_t bytes, cudaStream_t stream, absl::Time deadline) {
  return Post(
      "recv", [&] { return ncclRecv(buf, bytes, ncclUint8, 1 - rank_, comm_, stream); }, deadline);
}

absl::Status NcclLink::Group(const Buffer* sends, size_t num_sends, const Buffer* recvs,
                             size_t num_recvs, cudaStream_t stream, absl::Time deadline) {
  return Post(
      "group",
      [&] {
        ncclResult_t r = ncclGroupStart();
        for (size_t i = 0; i < num_sends && (r == ncclSuccess || r == ncclInProgress); ++i) {
          if (sends[i].bytes > 0)
            r = ncclSend(sends[i].data, sends[i].bytes, ncclUint8, 1 - rank_, comm_, stream);
        }
        for (size_t i = 0; i < num_recvs && (r == ncclSuccess || r == ncclInProgress); ++i) {
          if (recvs[i].bytes > 0)
            r = ncclRecv(recvs[i].data, recvs[i].bytes, ncclUint8, 1 - rank_, comm_, stream);
        }
        const ncclResult_t end = ncclGroupEnd();  // always closes the group
        return r == ncclSuccess || r == ncclInProgress ? end : r;
      },
      deadline);
}

absl::Status NcclLink::Wait(cudaStream_t stream, absl::Time deadline) {
  cudaSetDevice(device_);
  int spins = 0;
  while (true) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) {
      return Broken(
          absl::UnavailableError(absl::StrCat("NCCL link stream: ", cudaGetErrorString(e))));
    }
    if (abort_requested_.load()) return Broken(absl::UnavailableError("NCCL link: aborted"));
    ncclResult_t state = ncclSuccess;
    if (AsyncState(&state) != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      return Broken(NcclError("transfer", state));
    }
    if (absl::Now() > deadline) {
      return Broken(absl::DeadlineExceededError("NCCL transfer: the peer did not answer in time"));
    }
    // Spin briefly (transfers are short), then back off so an idle receiver
    // does not burn a core.
    if (++spins > 2000)
      std::this_thread::sleep_for(std::chrono::microseconds(spins > 20000 ? 200 : 20));
  }
}

}  // namespace moesh
