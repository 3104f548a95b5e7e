// The CUDA backend as a plugin: libmoesh_cuda_backends.so (built from
// kernels/cuda where nvcc is found) exports one C function returning this
// table; common/service/backends.cc loads it with dlopen on the first
// `--device cuda`.
//
// Why a plugin and not a link: the CUDA libraries carry ~160 KB of static
// TLS (cuBLASLt, with OpenBLAS), more than the fixed stacks civetweb gives
// its threads, so a binary linking them cannot serve /metrics; and CPU
// deployments should not need the CUDA runtime at all.
//
// The executable and the plugin must come from the same build: the table
// carries the sizes of the types it passes, checked on load.
#ifndef MOESH_COMMON_SERVICE_CUDA_BACKENDS_PLUGIN_H_
#define MOESH_COMMON_SERVICE_CUDA_BACKENDS_PLUGIN_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "common/service/backends.h"

namespace moesh {

constexpr int kCudaBackendsAbiVersion = 1;
constexpr char kCudaBackendsLibrary[] = "libmoesh_cuda_backends.so";
constexpr char kCudaBackendsSymbol[] = "moesh_cuda_backends_v1";

struct CudaBackendsTable {
  int abi_version = kCudaBackendsAbiVersion;
  size_t sizeof_model_config = sizeof(ModelConfig);
  size_t sizeof_device_options = sizeof(DeviceOptions);
  size_t sizeof_expert_shard = sizeof(ExpertShardWeights);
  absl::StatusOr<std::unique_ptr<AttentionBackend>> (*make_attention_backend)(const ModelConfig&, const Checkpoint&,
                                                                              const DeviceOptions&, bool) = nullptr;
  absl::StatusOr<std::unique_ptr<ExpertStage>> (*make_expert_stage)(const ModelConfig&,
                                                                    std::unique_ptr<ExpertShardWeights>,
                                                                    const DeviceOptions&) = nullptr;
};

}  // namespace moesh

// Defined by the plugin.
extern "C" const moesh::CudaBackendsTable* moesh_cuda_backends_v1();

#endif  // MOESH_COMMON_SERVICE_CUDA_BACKENDS_PLUGIN_H_
