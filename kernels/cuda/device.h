// RAII owners of CUDA device memory, streams and events, and device discovery.
//
// Every allocation is a plain cudaMalloc (never managed memory). The owners are
// movable, not copyable, and not thread-safe: one owner at a time.
#ifndef MOESH_KERNELS_CUDA_DEVICE_H_
#define MOESH_KERNELS_CUDA_DEVICE_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "base/status.h"
#include "kernels/cuda/cuda_status.h"

namespace moesh::cuda {

// Number of usable CUDA devices: 0 (not an error) when there is no driver or
// no device; an error Status for any other failure.
absl::StatusOr<int> CudaDeviceCount();

// Typed device allocation of `size()` elements; uninitialised.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // RESOURCE_EXHAUSTED (or INTERNAL) if cudaMalloc fails.
  static absl::StatusOr<DeviceBuffer> Create(size_t size) {
    DeviceBuffer b;
    if (size > 0) {
      const cudaError_t err = cudaMalloc(reinterpret_cast<void**>(&b.ptr_), size * sizeof(T));
      if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return absl::ResourceExhaustedError(
            absl::StrCat("cudaMalloc of ", size * sizeof(T), " bytes: out of device memory"));
      }
      RETURN_IF_ERROR(CudaStatus(err, "cudaMalloc"));
    }
    b.size_ = size;
    return b;
  }

  // Replaces the buffer with a new one of max(n, 1) elements (scratch that
  // always has an address), as Create.
  absl::Status Reallocate(size_t n) {
    *this = DeviceBuffer();
    ASSIGN_OR_RETURN(*this, Create(n > 0 ? n : 1));
    return absl::OkStatus();
  }

  T* get() const { return ptr_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }

  // Synchronous copies; REQUIRES: host.size() == size().
  absl::Status CopyFrom(const std::vector<T>& host) {
    if (host.size() != size_)
      return absl::InvalidArgumentError("DeviceBuffer::CopyFrom: size mismatch");
    return CudaStatus(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice),
                      "cudaMemcpy H2D");
  }
  absl::StatusOr<std::vector<T>> ToHost() const {
    std::vector<T> host(size_);
    RETURN_IF_ERROR(CudaStatus(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost),
                               "cudaMemcpy D2H"));
    return host;
  }

 private:
  void Reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }
  T* ptr_ = nullptr;
  size_t size_ = 0;
};

// Page-locked host memory of `size()` elements (cudaMallocHost), for async
// copies; uninitialised.
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Reset(); }
  PinnedBuffer(PinnedBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      Reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  static absl::StatusOr<PinnedBuffer> Create(size_t size) {
    PinnedBuffer b;
    if (size > 0) {
      RETURN_IF_ERROR(CudaStatus(
          cudaMallocHost(reinterpret_cast<void**>(&b.ptr_), size * sizeof(T)), "cudaMallocHost"));
    }
    b.size_ = size;
    return b;
  }

  T* get() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  void Reset() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    size_ = 0;
  }
  T* ptr_ = nullptr;
  size_t size_ = 0;
};

// A non-blocking stream.
class Stream {
 public:
  static absl::StatusOr<Stream> Create();
  Stream() = default;
  ~Stream();
  Stream(Stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return s_; }
  absl::Status Synchronize() const;

 private:
  cudaStream_t s_ = nullptr;
};

// A timing event.
class Event {
 public:
  static absl::StatusOr<Event> Create();
  Event() = default;
  ~Event();
  Event(Event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  cudaEvent_t get() const { return e_; }
  absl::Status Record(cudaStream_t stream);
  // Blocks the host until the work recorded before this event is done.
  absl::Status Synchronize() const;
  // Milliseconds from `start` to this event; both must have completed.
  absl::StatusOr<float> ElapsedMsSince(const Event& start) const;

 private:
  cudaEvent_t e_ = nullptr;
};

// A second stream that work forks onto from another stream and joins back
// from, ordered by events; under stream capture the fork pulls it into the
// capture and the join ends its part there (every fork needs its join
// before the capture ends).
class ForkedStream {
 public:
  static absl::StatusOr<ForkedStream> Create();
  ForkedStream() = default;

  cudaStream_t get() const { return stream_.get(); }
  bool created() const { return stream_.get() != nullptr; }
  // Work enqueued here from now on runs after `from`'s work enqueued so far.
  absl::Status Fork(cudaStream_t from);
  // Work enqueued on `into` from now on runs after this stream's so far.
  absl::Status Join(cudaStream_t into);

 private:
  Stream stream_;
  Event fork_, join_;
};

// Facts of the current device that launch configurations depend on (asked of
// the runtime once a device, then cached: cheap enough for every launch).
struct DeviceInfo {
  int device = 0;
  int num_sms = 0;
  int max_smem_per_block_optin = 0;  // bytes
  int l2_bytes = 0;
  int cc_major = 0, cc_minor = 0;
};
absl::StatusOr<DeviceInfo> CurrentDeviceInfo();

// Makes `ordinal` the calling thread's device (the CUDA runtime's current
// device is per thread). FAILED_PRECONDITION without a GPU, INVALID_ARGUMENT
// for an ordinal beyond the devices present.
absl::Status UseDevice(int ordinal);

// CUDA IPC memory, on the current device: IpcMemHandle gives the
// cudaIpcMemHandle_t bytes of the allocation at `base` (from cudaMalloc);
// OpenIpcMemHandle maps another process's handle into this one (peer access
// enabled lazily; close with cudaIpcCloseMemHandle). INVALID_ARGUMENT for a
// handle of the wrong size, UNAVAILABLE if CUDA refuses it (e.g. the
// exporter is gone, or it is this process's own).
absl::StatusOr<std::string> IpcMemHandle(void* base);
absl::StatusOr<void*> OpenIpcMemHandle(const std::string& handle);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_DEVICE_H_
