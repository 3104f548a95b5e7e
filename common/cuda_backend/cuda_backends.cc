// libmoesh_cuda_backends.so: common/backend/cuda_backends_plugin.h's table,
// the CUDA factories behind `--device cuda`.
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/backend/cuda_backends_plugin.h"
#include "common/cuda_backend/cuda_attention_backend.h"
#include "common/cuda_backend/cuda_expert_stage.h"
#include "common/cuda_backend/cuda_ipc_memory.h"
#include "common/cuda_backend/cuda_model.h"
#include "common/cuda_backend/nccl_link.h"
#include "common/cuda_backend/nccl_pipe.h"
#include "kernels/cuda/device.h"

namespace moesh {
namespace {

// "cuda" (the current device) or "cuda:N", made the calling thread's device.
absl::Status SelectDevice(const std::string& device) {
  ASSIGN_OR_RETURN(const int count, cuda::CudaDeviceCount());
  if (count == 0)
    return absl::FailedPreconditionError(
        absl::StrCat("--device ", device, ": no CUDA device is present"));
  int ordinal = 0;
  if (device != "cuda") {
    if (!absl::SimpleAtoi(device.substr(5), &ordinal)) {
      return absl::InvalidArgumentError(absl::StrCat("bad CUDA device \"", device, "\""));
    }
  } else {
    RETURN_IF_CUDA_ERROR(cudaGetDevice(&ordinal));
  }
  return cuda::UseDevice(ordinal);
}

absl::StatusOr<std::unique_ptr<AttentionBackend>> MakeCudaAttentionBackend(
    const ModelConfig& config, const Checkpoint* ckpt, const DeviceOptions& options,
    bool with_experts) {
  RETURN_IF_ERROR(SelectDevice(options.device));
  cuda::CudaModelOptions o;
  o.gpu_memory_utilization = options.gpu_memory_utilization;
  o.max_num_seqs = options.max_num_seqs;
  o.max_model_len = options.max_model_len;
  o.fp8_linears = options.fp8_linears;
  o.prefix_cache = options.prefix_cache;
  o.fp8_kv_cache = options.fp8_kv_cache;
  o.routed_experts_on_device = with_experts;
  std::unique_ptr<cuda::CudaModel> model;
  if (options.dummy_weights) {
    ASSIGN_OR_RETURN(model, cuda::CudaModel::Dummy(config, options.dummy_seed, o));
  } else {
    ASSIGN_OR_RETURN(model, cuda::CudaModel::FromCheckpoint(config, *ckpt, o));
  }
  return std::unique_ptr<AttentionBackend>(new cuda::CudaAttentionBackend(std::move(model)));
}

absl::StatusOr<std::unique_ptr<ExpertStage>> MakeCudaExpertStage(
    const ModelConfig& config, std::unique_ptr<ExpertShardWeights> weights,
    const DeviceOptions& options) {
  RETURN_IF_ERROR(SelectDevice(options.device));
  ASSIGN_OR_RETURN(std::unique_ptr<cuda::CudaExpertStage> stage,
                   cuda::CudaExpertStage::Create(config, std::move(weights),
                                                 options.fp8_linears || config.fp8_block_weights));
  return std::unique_ptr<ExpertStage>(std::move(stage));
}

absl::StatusOr<std::string> NewNcclId() {
  ASSIGN_OR_RETURN(ncclUniqueId id, NewNcclUniqueId());
  return UniqueIdToBytes(id);
}

absl::StatusOr<std::unique_ptr<BytePipe>> OpenNcclPipe(const std::string& unique_id, int rank,
                                                       int device, absl::Time deadline) {
  ASSIGN_OR_RETURN(std::unique_ptr<NcclPipe> pipe,
                   NcclPipe::Open(unique_id, rank, device, deadline));
  return std::unique_ptr<BytePipe>(std::move(pipe));
}

}  // namespace
}  // namespace moesh

extern "C" __attribute__((visibility("default"))) const moesh::CudaBackendsTable*
moesh_cuda_backends_v1() {
  static const moesh::CudaBackendsTable table = [] {
    moesh::CudaBackendsTable t;
    t.make_attention_backend = moesh::MakeCudaAttentionBackend;
    t.make_expert_stage = moesh::MakeCudaExpertStage;
    t.new_nccl_id = moesh::NewNcclId;
    t.open_nccl_pipe = moesh::OpenNcclPipe;
    t.device_count = moesh::cuda::CudaDeviceCount;
    t.open_device_memory = moesh::OpenCudaDeviceMemory;
    return t;
  }();
  return &table;
}
