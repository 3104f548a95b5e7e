// The flags that choose where a service computes (--device and the CUDA
// memory knobs), shared by the prefill, decode and expert workers and the
// router's colocated mode.
#ifndef MOESH_COMMON_SERVICE_DEVICE_FLAGS_H_
#define MOESH_COMMON_SERVICE_DEVICE_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/backend/backends.h"

namespace moesh {

// --device, --gpu_memory_utilization, --max_model_len, --load_format, --quantization as
// DeviceOptions (the KV pool fields left at their defaults). INVALID_ARGUMENT
// for a bad device name, a utilization outside (0, 1], or dummy weights off
// the GPU.
absl::StatusOr<DeviceOptions> DeviceOptionsFromFlags();
// The flags that set the fields above in `o` (flag_args.cc): --device,
// --gpu_memory_utilization, --max_model_len, --load_format (dummy_weights),
// --quantization (fp8_linears).
void AppendArgs(const DeviceOptions& o, std::vector<std::string>* args);

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_DEVICE_FLAGS_H_
