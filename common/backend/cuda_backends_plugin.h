// The CUDA backend as a plugin: libmoesh_cuda_backends.so (built from
// common/cuda_backend where nvcc is found) exports one C function returning this
// table; common/backend/backends.cc loads it with dlopen on the first
// `--device cuda`.
//
// Why a plugin and not a link: the CUDA libraries carry ~160 KB of static
// TLS (cuBLASLt, with OpenBLAS), more than the fixed stacks civetweb gives
// its threads, so a binary linking them cannot serve /metrics; and CPU
// deployments should not need the CUDA runtime at all.
//
// The executable and the plugin must come from the same build: the table
// carries the sizes of the types it passes, checked on load.
#ifndef MOESH_COMMON_BACKEND_CUDA_BACKENDS_PLUGIN_H_
#define MOESH_COMMON_BACKEND_CUDA_BACKENDS_PLUGIN_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/backend/backends.h"
#include "common/backend/byte_pipe.h"
#include "common/backend/device_memory.h"

namespace moesh {

// 11: MoeDispatch's device flags (ready_flag, done_flag), DeviceMemory::WriteFlag / WaitFlag
// (OpenEvent gone);
// 10: MoeDispatch::wire (the host wire's encodings: --dispatch_dtype);
// 9: ExpertShardWeights::deferred (experts read from the checkpoint by the device);
// 8: the prefix cache's virtuals on KvSequence and AttentionBackend, DeviceOptions::prefix_cache;
// 7: FP8 linears; 6: interprocess events on DeviceMemory; 5: KvSequence device blocks
constexpr int kCudaBackendsAbiVersion = 11;
constexpr char kCudaBackendsLibrary[] = "libmoesh_cuda_backends.so";
constexpr char kCudaBackendsSymbol[] = "moesh_cuda_backends_v1";

struct CudaBackendsTable {
  int abi_version = kCudaBackendsAbiVersion;
  size_t sizeof_model_config = sizeof(ModelConfig);
  size_t sizeof_device_options = sizeof(DeviceOptions);
  size_t sizeof_expert_shard = sizeof(ExpertShardWeights);
  absl::StatusOr<std::unique_ptr<AttentionBackend>> (*make_attention_backend)(const ModelConfig&,
                                                                              const Checkpoint*,
                                                                              const DeviceOptions&,
                                                                              bool) = nullptr;
  absl::StatusOr<std::unique_ptr<ExpertStage>> (*make_expert_stage)(
      const ModelConfig&, std::unique_ptr<ExpertShardWeights>, const DeviceOptions&) = nullptr;
  // The nccl transport's pieces (common/cuda_backend/nccl_pipe.h): a new NCCL
  // unique id as bytes, and a pipe joining the communicator of such an id.
  absl::StatusOr<std::string> (*new_nccl_id)() = nullptr;
  absl::StatusOr<std::unique_ptr<BytePipe>> (*open_nccl_pipe)(const std::string& unique_id,
                                                              int rank, int device,
                                                              absl::Time deadline) = nullptr;
  // CUDA devices present (0 without a driver or a GPU).
  absl::StatusOr<int> (*device_count)() = nullptr;
  // The cuda_ipc transport's device side (common/backend/device_memory.h).
  absl::StatusOr<std::unique_ptr<DeviceMemory>> (*open_device_memory)(int device) = nullptr;
};

// The plugin's table, loaded on first use (backends.cc):
// FAILED_PRECONDITION where there is none or it is from another build.
absl::StatusOr<const CudaBackendsTable*> CudaBackends();

}  // namespace moesh

// Defined by the plugin.
extern "C" const moesh::CudaBackendsTable* moesh_cuda_backends_v1();

#endif  // MOESH_COMMON_BACKEND_CUDA_BACKENDS_PLUGIN_H_
