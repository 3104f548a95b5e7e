#include "common/cuda_backend/cuda_ipc_memory.h"

#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "kernels/cuda/copy_ranges.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/stream_flag.h"

namespace moesh {
namespace {

using cuda::CudaStatus;

// Device memory this process allocated and exported (`handle` set; freed on
// destruction) or mapped from another process (unmapped on destruction).
class Region : public DeviceRegion {
 public:
  Region(int device, void* ptr, size_t size, std::string handle)
      : device_(device), ptr_(ptr), size_(size), handle_(std::move(handle)) {}
  ~Region() override {
    cudaSetDevice(device_);
    if (handle_.empty()) {
      cudaIpcCloseMemHandle(ptr_);
    } else {
      cudaFree(ptr_);
    }
  }
  void* data() const override { return ptr_; }
  size_t size() const override { return size_; }
  const std::string& handle() const override { return handle_; }

 private:
  const int device_;
  void* const ptr_;
  const size_t size_;
  const std::string handle_;  // empty iff imported
};

class Event : public DeviceEvent {
 public:
  Event(int device, cudaEvent_t event, std::string handle)
      : device_(device), event_(event), handle_(std::move(handle)) {}
  ~Event() override {
    cudaSetDevice(device_);
    cudaEventDestroy(event_);
  }
  void* get() const override { return event_; }
  const std::string& handle() const override { return handle_; }

 private:
  const int device_;
  const cudaEvent_t event_;
  const std::string handle_;  // empty iff opened from a peer's
};

class CudaDeviceMemory : public DeviceMemory {
 public:
  CudaDeviceMemory(int device, cuda::Stream stream) : device_(device), stream_(std::move(stream)) {}
  int device() const override { return device_; }

  absl::StatusOr<std::unique_ptr<DeviceRegion>> Export(size_t bytes) override {
    RETURN_IF_ERROR(cuda::UseDevice(device_));
    void* ptr = nullptr;
    const cudaError_t err = cudaMalloc(&ptr, bytes);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat("cuda:", device_, " has no ", bytes,
                                                       " bytes free for the cuda_ipc buffers"));
    }
    RETURN_IF_ERROR(CudaStatus(err, "cudaMalloc"));
    absl::StatusOr<std::string> handle = cuda::IpcMemHandle(ptr);
    if (!handle.ok()) {
      cudaFree(ptr);
      return handle.status();
    }
    return std::unique_ptr<DeviceRegion>(new Region(device_, ptr, bytes, *std::move(handle)));
  }

  absl::StatusOr<std::unique_ptr<DeviceRegion>> Import(const std::string& handle,
                                                       size_t bytes) override {
    RETURN_IF_ERROR(cuda::UseDevice(device_));
    ASSIGN_OR_RETURN(void* ptr, cuda::OpenIpcMemHandle(handle));
    return std::unique_ptr<DeviceRegion>(new Region(device_, ptr, bytes, ""));
  }

  absl::Status Copy(absl::Span<const CopyRange> copies, void* stream, void* after) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(cuda::UseDevice(device_));
    cudaStream_t s = stream != nullptr ? static_cast<cudaStream_t>(stream) : stream_.get();
    if (after != nullptr) {
      RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(after), 0),
                                 "cudaStreamWaitEvent"));
    }
    if (stream != nullptr && copies.size() > 1 && copies.size() <= cuda::kMaxCopyRanges) {
      // One launch instead of an operation a range (a cuda_ipc dispatch's three
      // input copies: ~4 us less a hand-off; BENCHMARKS, twenty-eighth session).
      cuda::CopyRangesParams p;
      for (const CopyRange& c : copies) p.ranges[p.num_ranges++] = {c.dst, c.src, c.bytes};
      p.stream = s;
      RETURN_IF_ERROR(cuda::RunCopyRanges(p));
    } else {
      for (const CopyRange& c : copies) {
        if (c.bytes == 0) continue;
        RETURN_IF_ERROR(
            CudaStatus(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDeviceToDevice, s),
                       "cudaMemcpyAsync"));
      }
    }
    return stream != nullptr ? absl::OkStatus() : stream_.Synchronize();
  }

  absl::Status WriteFlag(void* stream, uint32_t* flag, uint32_t value) override {
    RETURN_IF_ERROR(cuda::UseDevice(device_));
    if (stream != nullptr)
      return cuda::StreamWriteFlag(static_cast<cudaStream_t>(stream), flag, value);
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(cuda::StreamWriteFlag(stream_.get(), flag, value));
    return stream_.Synchronize();
  }

  absl::Status WaitFlag(void* stream, uint32_t* flag, uint32_t value) override {
    RETURN_IF_ERROR(cuda::UseDevice(device_));
    if (stream == nullptr) return absl::InvalidArgumentError("WaitFlag: needs a stream");
    return cuda::StreamWaitFlag(static_cast<cudaStream_t>(stream), flag, value);
  }

  absl::Status Synchronize(void* stream) override {
    RETURN_IF_ERROR(cuda::UseDevice(device_));
    return CudaStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)),
                      "cudaStreamSynchronize");
  }

  absl::StatusOr<std::unique_ptr<DeviceEvent>> MakeEvent() override {
    RETURN_IF_ERROR(cuda::UseDevice(device_));
    cudaEvent_t e = nullptr;
    RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventInterprocess),
                   "cudaEventCreateWithFlags"));
    cudaIpcEventHandle_t h;
    if (absl::Status s = CudaStatus(cudaIpcGetEventHandle(&h, e), "cudaIpcGetEventHandle");
        !s.ok()) {
      cudaEventDestroy(e);
      return s;
    }
    return std::unique_ptr<DeviceEvent>(
        new Event(device_, e, std::string(reinterpret_cast<const char*>(&h), sizeof(h))));
  }

  absl::Status Record(const DeviceEvent& event, void* stream) override {
    RETURN_IF_ERROR(cuda::UseDevice(device_));
    return CudaStatus(
        cudaEventRecord(static_cast<cudaEvent_t>(event.get()), static_cast<cudaStream_t>(stream)),
        "cudaEventRecord");
  }

  absl::Status Wait(void* stream, const DeviceEvent& event) override {
    RETURN_IF_ERROR(cuda::UseDevice(device_));
    return CudaStatus(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                          static_cast<cudaEvent_t>(event.get()), 0),
                      "cudaStreamWaitEvent");
  }

  absl::Status Add(float* dst, const float* src, int rows, int cols, void* stream) override {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(cuda::UseDevice(device_));
    cuda::MoeCombineParams p;  // x += expert_out (no permutation, no weights)
    p.expert_out = src, p.num_tokens = rows, p.top_k = 1, p.hidden = cols, p.x = dst;
    p.stream = stream != nullptr ? static_cast<cudaStream_t>(stream) : stream_.get();
    RETURN_IF_ERROR(cuda::RunMoeCombine(p));
    return stream != nullptr ? absl::OkStatus() : stream_.Synchronize();
  }

 private:
  const int device_;
  absl::Mutex mu_;
  cuda::Stream stream_;  // guarded by mu_
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceMemory>> OpenCudaDeviceMemory(int device) {
  RETURN_IF_ERROR(cuda::UseDevice(device));
  ASSIGN_OR_RETURN(cuda::Stream stream, cuda::Stream::Create());
  return std::unique_ptr<DeviceMemory>(new CudaDeviceMemory(device, std::move(stream)));
}

}  // namespace moesh
