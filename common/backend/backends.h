// Where a worker computes: the attention half (AttentionBackend) and expert
// shards (ExpertStage) on the CPU or a CUDA device, chosen by `--device`.
//
// The CUDA side is a plugin, libmoesh_cuda_backends.so (cuda_backends_plugin.h),
// loaded on first use from $MOESH_CUDA_BACKENDS, else beside the executable,
// else the dynamic loader's path; where it is missing (a build without nvcc)
// `--device cuda` answers FAILED_PRECONDITION saying so, and every binary
// takes the same flags.
#ifndef MOESH_COMMON_BACKEND_BACKENDS_H_
#define MOESH_COMMON_BACKEND_BACKENDS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/engine/attention_backend.h"
#include "common/model/config.h"
#include "common/model/expert_client.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"

namespace moesh {

struct DeviceOptions {
  std::string device = "cpu";  // cpu, cuda (the current device) or cuda:N
  // CPU: the KV pool (0 blocks: every sequence grows without bound).
  int num_kv_blocks = 0;
  int block_size = 64;
  // Reuse the KV rows of cached prompt prefixes (kv_block_allocator.h): on
  // the CPU with a pool (num_kv_blocks > 0), on CUDA in the device pool
  // (common/cuda_backend/kv_store.h) but for DeepSeek-V4, where it is off,
  // said once on stderr.
  bool prefix_cache = false;
  // CUDA (common/cuda_backend/cuda_model.h's options): the fraction of the
  // device's memory this process may bring the total to, sequences per step,
  // tokens per sequence (0: min(max_position_embeddings, 8192)).
  double gpu_memory_utilization = 0.9;
  int max_num_seqs = 256;
  int max_model_len = 0;
  // Random weights generated on the device instead of the checkpoint's (only
  // config.json is read): benchmarks at real shapes without the files.
  // CUDA only.
  bool dummy_weights = false;
  uint64_t dummy_seed = 0;
  // --quantization fp8: a bf16 checkpoint's dense linears quantized at load
  // to block-scaled FP8 (CUDA only; an FP8 checkpoint runs in FP8 without it).
  bool fp8_linears = false;
  // --kv_cache_dtype fp8: the KV cache in FlashMLA's FP8 layout (latent e4m3
  // with a power-of-two scale per 128 values, rope bf16; kernels/cpu/fp8.h):
  // the CPU engine's rows are what the CUDA pool's FP8 rows give back.
  bool fp8_kv_cache = false;
};

// The CPU engine's KV row format for `options` (--kv_cache_dtype): FP8 or
// native; on a CUDA device native (the CUDA pool holds its own FP8 rows).
// UNIMPLEMENTED where FP8 is not built: DeepSeek-V4, a kv_lora_rank not a
// multiple of 16. A V3.2 row's index key stays as it is (the CPU's float32;
// the CUDA pool's bf16). MakeAttentionBackend and
// MakeExpertStage apply it; a caller building a CPU backend itself must too.
absl::StatusOr<KvRowFormat> KvRowFormatFor(const ModelConfig& config, const DeviceOptions& options);

// OK for "cpu", "cuda" and "cuda:N" (N >= 0); INVALID_ARGUMENT otherwise.
absl::Status ValidateDevice(const std::string& device);
bool IsCudaDevice(const std::string& device);
// N of "cuda:N", 0 for "cuda" (the default device); FAILED_PRECONDITION for
// "cpu" naming `what` needs a GPU.
absl::StatusOr<int> CudaOrdinal(const std::string& device, const std::string& what);

// The attention half of the checkpoint's model on options.device. With
// `with_experts` the routed experts are loaded beside it (CUDA: on the
// device, and Forward then takes no ExpertClient); without, they run
// elsewhere behind the ExpertClient given to Forward. CPU backends never hold
// experts (with_experts: INVALID_ARGUMENT; use a LocalExpertClient).
// `ckpt` is null iff options.dummy_weights (FAILED_PRECONDITION on the CPU).
absl::StatusOr<std::unique_ptr<AttentionBackend>> MakeAttentionBackend(const ModelConfig& config,
                                                                       const Checkpoint* ckpt,
                                                                       const DeviceOptions& options,
                                                                       bool with_experts);

// An expert shard computing on options.device (CPU: ExpertStage itself).
// With options.dummy_weights, `weights` is a placeholder (ExpertShardWeights::
// Placeholder) and the device fills the experts with random values.
absl::StatusOr<std::unique_ptr<ExpertStage>> MakeExpertStage(
    const ModelConfig& config, std::unique_ptr<ExpertShardWeights> weights,
    const DeviceOptions& options);

}  // namespace moesh

#endif  // MOESH_COMMON_BACKEND_BACKENDS_H_
