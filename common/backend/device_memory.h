// The CUDA side of the cuda_ipc transport, as an interface so that the
// transport (common/transport/cuda_ipc_transport.cc) links no CUDA: the
// plugin (common/cuda_backend/cuda_ipc_memory.cc)
// implements it with CUDA IPC memory handles.
//
// Thread-safety: one DeviceMemory may be used from several threads; each
// call makes its device current on the calling thread.
#ifndef MOESH_COMMON_BACKEND_DEVICE_MEMORY_H_
#define MOESH_COMMON_BACKEND_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace moesh {

// Device memory mapped into this process: allocated here and exported, or
// imported from another process. Unmapped (exported: freed) on destruction.
class DeviceRegion {
 public:
  virtual ~DeviceRegion() = default;
  virtual void* data() const = 0;  // a device pointer in this process
  virtual size_t size() const = 0;
  // Exported regions: the bytes another process on this node passes to
  // DeviceMemory::Import (a cudaIpcMemHandle_t). Empty for imported ones.
  virtual const std::string& handle() const = 0;
};

// A CUDA event made by DeviceMemory::MakeEvent (cudaEventInterprocess;
// handle() its IPC bytes, which nothing opens today). Destroyed with it.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  virtual void* get() const = 0;                  // the cudaEvent_t
  virtual const std::string& handle() const = 0;  // cudaIpcEventHandle_t bytes (made here only)
};

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual int device() const = 0;
  // RESOURCE_EXHAUSTED if the device lacks the memory.
  virtual absl::StatusOr<std::unique_ptr<DeviceRegion>> Export(size_t bytes) = 0;
  // Maps another process's exported region (same node; another GPU needs
  // peer access). INVALID_ARGUMENT for a malformed handle, UNAVAILABLE if
  // CUDA refuses it (e.g. the exporter is gone, or it is this process's).
  virtual absl::StatusOr<std::unique_ptr<DeviceRegion>> Import(const std::string& handle,
                                                               size_t bytes) = 0;
  // Device-to-device copies, in order. `stream` null: on this object's own
  // stream, after cudaEvent_t `after` fires (if not null), returning when
  // they are done; else enqueued on that cudaStream_t (two to four ranges as
  // one launch: they must not overlap), returning at once.
  struct CopyRange {
    void* dst;
    const void* src;
    size_t bytes;
  };
  virtual absl::Status Copy(absl::Span<const CopyRange> copies, void* stream = nullptr,
                            void* after = nullptr) = 0;
  // Returns when the work enqueued on cudaStream_t `stream` is done.
  virtual absl::Status Synchronize(void* stream) = 0;
  // dst += src, both fp32 [rows, cols]; `stream` as for Copy.
  virtual absl::Status Add(float* dst, const float* src, int rows, int cols,
                           void* stream = nullptr) = 0;
  // Events, for ordering work between streams without the host waiting
  // (the nccl channel's): Record on cudaStream_t `stream`; Wait makes
  // `stream` wait for the event's latest record.
  virtual absl::StatusOr<std::unique_ptr<DeviceEvent>> MakeEvent() = 0;
  virtual absl::Status Record(const DeviceEvent& event, void* stream) = 0;
  virtual absl::Status Wait(void* stream, const DeviceEvent& event) = 0;
  // Device words (4-byte aligned, in device memory of this device, e.g. in a
  // region): WriteFlag sets *flag = value after the work before it on
  // cudaStream_t `stream` (null: at once, on this object's own stream,
  // returning when written); WaitFlag holds the work queued on `stream`
  // after it until *flag == value. Cheaper than an interprocess event
  // (the cuda_ipc channel's ordering of a dispatch between two processes);
  // a wait nobody satisfies blocks the stream until someone writes the value
  // (WriteFlag with a null stream).
  virtual absl::Status WriteFlag(void* stream, uint32_t* flag, uint32_t value) = 0;
  virtual absl::Status WaitFlag(void* stream, uint32_t* flag, uint32_t value) = 0;
};

// out (fp32 [rows, cols]) = src, or += src with `accumulate`: a device
// dispatch's sums delivered to its caller; `stream` as for DeviceMemory::Copy.
inline absl::Status DeliverSums(DeviceMemory& memory, float* out, const float* src, int rows,
                                int cols, bool accumulate, void* stream = nullptr) {
  if (accumulate) return memory.Add(out, src, rows, cols, stream);
  const DeviceMemory::CopyRange copy[] = {
      {out, src, static_cast<size_t>(rows) * cols * sizeof(float)}};
  return memory.Copy(copy, stream);
}

}  // namespace moesh

#endif  // MOESH_COMMON_BACKEND_DEVICE_MEMORY_H_
