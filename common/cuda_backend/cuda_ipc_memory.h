// DeviceMemory (common/backend/device_memory.h) over CUDA IPC memory
// handles, for the cuda_ipc transport. Built into the CUDA plugin.
#ifndef MOESH_COMMON_CUDA_BACKEND_CUDA_IPC_MEMORY_H_
#define MOESH_COMMON_CUDA_BACKEND_CUDA_IPC_MEMORY_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/backend/device_memory.h"

namespace moesh {

// FAILED_PRECONDITION without that device.
absl::StatusOr<std::unique_ptr<DeviceMemory>> OpenCudaDeviceMemory(int device);

}  // namespace moesh

#endif  // MOESH_COMMON_CUDA_BACKEND_CUDA_IPC_MEMORY_H_
