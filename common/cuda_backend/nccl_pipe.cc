#include "common/cuda_backend/nccl_pipe.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace moesh {
namespace {

constexpr uint64_t kMaxMessage = uint64_t{1} << 34;  // 16 GiB: a corrupt size, not a message

absl::Status Cuda(cudaError_t e, const char* what) {
  return e == cudaSuccess ? absl::OkStatus()
                          : absl::UnavailableError(
                                absl::StrCat("NCCL pipe: ", what, ": ", cudaGetErrorString(e)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclPipe>> NcclPipe::Open(const std::string& unique_id, int rank,
                                                         int device, absl::Time deadline) {
  absl::StatusOr<ncclUniqueId> id = UniqueIdFromBytes(unique_id);
  if (!id.ok()) return id.status();
  absl::StatusOr<std::unique_ptr<NcclLink>> link = NcclLink::Create(*id, rank, device, deadline);
  if (!link.ok()) return link.status();
  cudaStream_t stream = nullptr;
  if (absl::Status s = Cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
      !s.ok())
    return s;
  std::unique_ptr<NcclPipe> pipe(new NcclPipe(std::move(*link), stream));
  if (absl::Status s = pipe->Reserve(1 << 20); !s.ok()) return s;
  return pipe;  // (NcclLink::Create connected both directions)
}

NcclPipe::~NcclPipe() {
  cudaSetDevice(link_->device());
  link_.reset();  // aborts the communicator first, so nothing still runs on the stream
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
  if (device_ != nullptr) cudaFree(device_);
  if (host_ != nullptr) cudaFreeHost(host_);
}

absl::Status NcclPipe::Reserve(size_t bytes) {
  if (bytes <= capacity_) return absl::OkStatus();
  size_t cap = std::max(capacity_ * 2, bytes);
  cudaSetDevice(link_->device());
  if (device_ != nullptr) cudaFree(device_);
  if (host_ != nullptr) cudaFreeHost(host_);
  device_ = nullptr;
  host_ = nullptr;
  capacity_ = 0;
  if (absl::Status s = Cuda(cudaMalloc(&device_, cap), "cudaMalloc"); !s.ok()) return s;
  if (absl::Status s =
          Cuda(cudaMallocHost(reinterpret_cast<void**>(&host_), cap), "cudaMallocHost");
      !s.ok())
    return s;
  capacity_ = cap;
  return absl::OkStatus();
}

absl::Status NcclPipe::Send(const std::string& bytes, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (bytes.empty()) return absl::OkStatus();
  cudaSetDevice(link_->device());
  if (absl::Status s = Reserve(bytes.size()); !s.ok()) return s;
  std::memcpy(host_, bytes.data(), bytes.size());
  if (absl::Status s = Cuda(
          cudaMemcpyAsync(device_, host_, bytes.size(), cudaMemcpyHostToDevice, stream_), "H2D");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = link_->Send(device_, bytes.size(), stream_, deadline); !s.ok()) return s;
  return link_->Wait(stream_, deadline);
}

absl::StatusOr<std::string> NcclPipe::Recv(size_t bytes, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  std::string out;
  if (bytes == 0) return out;
  if (bytes > kMaxMessage)
    return absl::InvalidArgumentError(absl::StrCat("NCCL pipe: a message of ", bytes, " bytes"));
  cudaSetDevice(link_->device());
  if (absl::Status s = Reserve(bytes); !s.ok()) return s;
  if (absl::Status s = link_->Recv(device_, bytes, stream_, deadline); !s.ok()) return s;
  if (absl::Status s =
          Cuda(cudaMemcpyAsync(host_, device_, bytes, cudaMemcpyDeviceToHost, stream_), "D2H");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = link_->Wait(stream_, deadline); !s.ok()) return s;
  out.assign(host_, bytes);
  return out;
}

absl::Status NcclPipe::Exchange(absl::Span<const DeviceBuffer> sends,
                                absl::Span<const DeviceBuffer> recvs, absl::Span<void* const> after,
                                void* done, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  cudaSetDevice(link_->device());
  for (void* e : after) {
    if (e == nullptr) continue;
    if (absl::Status s = Cuda(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(e), 0), "wait");
        !s.ok())
      return s;
  }
  std::vector<NcclLink::Buffer> out, in;
  for (const DeviceBuffer& b : sends) out.push_back({b.data, b.bytes});
  for (const DeviceBuffer& b : recvs) in.push_back({b.data, b.bytes});
  // The sends as one group, then the receives as another: in one group NCCL
  // may pair a receive with the first send and hold the later sends until
  // it completes, which deadlocks when the peer answers only once it has
  // every send.
  if (!out.empty()) {
    if (absl::Status s = link_->Group(out.data(), out.size(), nullptr, 0, stream_, deadline);
        !s.ok())
      return s;
  }
  if (!in.empty()) {
    if (absl::Status s = link_->Group(nullptr, 0, in.data(), in.size(), stream_, deadline); !s.ok())
      return s;
  }
  if (done == nullptr) return absl::OkStatus();
  return Cuda(cudaEventRecord(static_cast<cudaEvent_t>(done), stream_), "record");
}

absl::Status NcclPipe::Drain(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return link_->Wait(stream_, deadline);
}

}  // namespace moesh
