#include "kernels/cuda/device.h"

#include <cstring>
#include <map>
#include <mutex>

namespace moesh::cuda {

absl::StatusOr<int> CudaDeviceCount() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
      err == cudaErrorSystemDriverMismatch || err == cudaErrorCompatNotSupportedOnDevice) {
    cudaGetLastError();  // not sticky, but leave the runtime clean
    return 0;
  }
  RETURN_IF_CUDA_ERROR(err);
  return n;
}

absl::StatusOr<Stream> Stream::Create() {
  Stream s;
  RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&s.s_, cudaStreamNonBlocking));
  return s;
}

Stream::~Stream() {
  if (s_ != nullptr) cudaStreamDestroy(s_);
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    if (s_ != nullptr) cudaStreamDestroy(s_);
    s_ = std::exchange(o.s_, nullptr);
  }
  return *this;
}

absl::Status Stream::Synchronize() const {
  return CudaStatus(cudaStreamSynchronize(s_), "cudaStreamSynchronize");
}

absl::StatusOr<Event> Event::Create() {
  Event e;
  RETURN_IF_CUDA_ERROR(cudaEventCreate(&e.e_));
  return e;
}

Event::~Event() {
  if (e_ != nullptr) cudaEventDestroy(e_);
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    if (e_ != nullptr) cudaEventDestroy(e_);
    e_ = std::exchange(o.e_, nullptr);
  }
  return *this;
}

absl::Status Event::Record(cudaStream_t stream) {
  return CudaStatus(cudaEventRecord(e_, stream), "cudaEventRecord");
}

absl::Status Event::Synchronize() const {
  return CudaStatus(cudaEventSynchronize(e_), "cudaEventSynchronize");
}

absl::StatusOr<ForkedStream> ForkedStream::Create() {
  ForkedStream f;
  ASSIGN_OR_RETURN(f.stream_, Stream::Create());
  ASSIGN_OR_RETURN(f.fork_, Event::Create());
  ASSIGN_OR_RETURN(f.join_, Event::Create());
  return f;
}

absl::Status ForkedStream::Fork(cudaStream_t from) {
  RETURN_IF_ERROR(fork_.Record(from));
  return CudaStatus(cudaStreamWaitEvent(stream_.get(), fork_.get(), 0), "cudaStreamWaitEvent");
}

absl::Status ForkedStream::Join(cudaStream_t into) {
  RETURN_IF_ERROR(join_.Record(stream_.get()));
  return CudaStatus(cudaStreamWaitEvent(into, join_.get(), 0), "cudaStreamWaitEvent");
}

absl::StatusOr<float> Event::ElapsedMsSince(const Event& start) const {
  RETURN_IF_CUDA_ERROR(cudaEventSynchronize(e_));
  float ms = 0.0f;
  RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, start.e_, e_));
  return ms;
}

absl::StatusOr<DeviceInfo> CurrentDeviceInfo() {
  // Fixed for a device's life: asked once a device, then served from here
  // (launchers ask at every launch).
  static std::mutex mu;
  static std::map<int, DeviceInfo>* const known = new std::map<int, DeviceInfo>;
  DeviceInfo info;
  RETURN_IF_CUDA_ERROR(cudaGetDevice(&info.device));
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = known->find(info.device); it != known->end()) return it->second;
  }
  RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&info.num_sms, cudaDevAttrMultiProcessorCount, info.device));
  RETURN_IF_CUDA_ERROR(cudaDeviceGetAttribute(
      &info.max_smem_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, info.device));
  RETURN_IF_CUDA_ERROR(cudaDeviceGetAttribute(&info.l2_bytes, cudaDevAttrL2CacheSize, info.device));
  RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&info.cc_major, cudaDevAttrComputeCapabilityMajor, info.device));
  RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&info.cc_minor, cudaDevAttrComputeCapabilityMinor, info.device));
  std::lock_guard<std::mutex> lock(mu);
  known->emplace(info.device, info);
  return info;
}

absl::Status UseDevice(int ordinal) {
  ASSIGN_OR_RETURN(const int n, CudaDeviceCount());
  if (n == 0)
    return absl::FailedPreconditionError(
        "no CUDA device is present (cudaGetDeviceCount found none)");
  if (ordinal < 0 || ordinal >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", ordinal, " does not exist (", n, " present)"));
  }
  return CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice");
}

absl::StatusOr<std::string> IpcMemHandle(void* base) {
  cudaIpcMemHandle_t h;
  RETURN_IF_CUDA_ERROR(cudaIpcGetMemHandle(&h, base));
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

absl::StatusOr<void*> OpenIpcMemHandle(const std::string& handle) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a CUDA IPC handle has ", sizeof(cudaIpcMemHandle_t), " bytes, not ", handle.size()));
  }
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* ptr = nullptr;
  const cudaError_t err = cudaIpcOpenMemHandle(&ptr, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();
    int device = -1;
    cudaGetDevice(&device);
    return absl::UnavailableError(absl::StrCat("cudaIpcOpenMemHandle on cuda:", device, ": ",
                                               cudaGetErrorName(err), ": ",
                                               cudaGetErrorString(err)));
  }
  return ptr;
}

}  // namespace moesh::cuda
