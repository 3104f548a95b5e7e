#include "common/backend/backends.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "common/backend/cuda_backends_plugin.h"

namespace moesh {
namespace {

std::string ExecutableDir() {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return ".";
  const std::string path(self, len);
  return path.substr(0, path.rfind('/'));
}

}  // namespace

// Loaded once (the handle is never closed).
absl::StatusOr<const CudaBackendsTable*> CudaBackends() {
  static absl::Mutex mu(absl::kConstInit);
  static const CudaBackendsTable* table = nullptr;
  absl::MutexLock lock(&mu);
  if (table != nullptr) return table;
  std::vector<std::string> tried;
  void* handle = nullptr;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MOESH_CUDA_BACKENDS"); env != nullptr && *env != '\0') {
    candidates = {env};  // an explicit choice: nothing else
  } else {
    candidates = {ExecutableDir() + "/" + kCudaBackendsLibrary, kCudaBackendsLibrary};
  }
  for (const std::string& c : candidates) {
    handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
    tried.push_back(dlerror());
  }
  if (handle == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this moesh has no CUDA backend (", absl::StrJoin(tried, "; "),
        "): build where nvcc is found with -DMOESH_CUDA=ON, which puts ", kCudaBackendsLibrary,
        " beside the binaries, or set MOESH_CUDA_BACKENDS to its path"));
  }
  using Entry = const CudaBackendsTable* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, kCudaBackendsSymbol));
  if (entry == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(kCudaBackendsLibrary, " lacks ", kCudaBackendsSymbol));
  }
  const CudaBackendsTable* t = entry();
  const CudaBackendsTable mine;
  if (t == nullptr || t->abi_version != mine.abi_version ||
      t->sizeof_model_config != mine.sizeof_model_config ||
      t->sizeof_device_options != mine.sizeof_device_options ||
      t->sizeof_expert_shard != mine.sizeof_expert_shard || t->make_attention_backend == nullptr ||
      t->make_expert_stage == nullptr || t->new_nccl_id == nullptr ||
      t->open_nccl_pipe == nullptr || t->device_count == nullptr ||
      t->open_device_memory == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(kCudaBackendsLibrary, " comes from another build of moesh than this binary"));
  }
  table = t;
  return table;
}

bool IsCudaDevice(const std::string& device) {
  return device == "cuda" || absl::StartsWith(device, "cuda:");
}

absl::Status ValidateDevice(const std::string& device) {
  if (device == "cpu" || device == "cuda") return absl::OkStatus();
  int ordinal = -1;
  if (absl::StartsWith(device, "cuda:") && absl::SimpleAtoi(device.substr(5), &ordinal) &&
      ordinal >= 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device must be cpu, cuda or cuda:N, not \"", device, "\""));
}

absl::StatusOr<int> CudaOrdinal(const std::string& device, const std::string& what) {
  RETURN_IF_ERROR(ValidateDevice(device));
  if (!IsCudaDevice(device))
    return absl::FailedPreconditionError(absl::StrCat(what, " needs --device cuda or cuda:N"));
  int ordinal = 0;
  if (device != "cuda" && !absl::SimpleAtoi(device.substr(5), &ordinal)) {
    return absl::InternalError(absl::StrCat("CudaOrdinal: \"", device, "\" passed validation"));
  }
  return ordinal;
}

namespace {

// The quantization `options` ask for and the checkpoint has, on this device:
// --quantization fp8 is a bf16 checkpoint's, on a GPU, and not DeepSeek-V4's
// (whose FP8 checkpoints run their linears in bf16 there, exactly, and their
// routed experts in MXFP4: device_weights.h's RoutedExpertFormat).
absl::Status CheckQuantization(const ModelConfig& config, const DeviceOptions& options) {
  if (options.fp8_linears && config.fp8_block_weights) {
    return absl::InvalidArgumentError(
        "--quantization fp8: the checkpoint is FP8 already (its config.json's "
        "quantization_config); it runs in FP8 without the flag");
  }
  if (options.fp8_linears && config.layers() == LayerArch::kV4) {
    return absl::UnimplementedError(
        "--quantization fp8 is not supported for DeepSeek-V4: its CUDA path runs the attention "
        "linears in bf16 (a V4 FP8 checkpoint's routed experts run in MXFP4 as shipped)");
  }
  if (options.fp8_linears && !IsCudaDevice(options.device)) {
    return absl::FailedPreconditionError(
        "--quantization fp8 computes on FP8 tensor cores: it needs --device cuda");
  }
  return absl::OkStatus();
}

}  // namespace

// The CUDA backend keeps FP8 rows in its own pool (CudaModelOptions::
// fp8_kv_cache) and takes the flag from `options`.
absl::StatusOr<KvRowFormat> KvRowFormatFor(const ModelConfig& config,
                                           const DeviceOptions& options) {
  if (!options.fp8_kv_cache) return KvRowFormat();
  if (config.layers() == LayerArch::kV4) {
    return absl::UnimplementedError(
        "--kv_cache_dtype fp8 covers MLA's latent and rope rows (DeepSeek-V2, V3 and V3.2); "
        "DeepSeek-V4's compressed entries are not FP8 here yet");
  }
  if (config.kv_lora_rank % 16 != 0) {
    return absl::UnimplementedError(absl::StrCat(
        "--kv_cache_dtype fp8 needs kv_lora_rank a multiple of 16 (the FP8 row's scales sit "
        "after the latent codes, 16-byte aligned); this model's is ",
        config.kv_lora_rank));
  }
  if (IsCudaDevice(options.device)) return KvRowFormat();
  return KvRowFormat::Fp8(config);
}

absl::StatusOr<std::unique_ptr<AttentionBackend>> MakeAttentionBackend(const ModelConfig& config,
                                                                       const Checkpoint* ckpt,
                                                                       const DeviceOptions& options,
                                                                       bool with_experts) {
  RETURN_IF_ERROR(ValidateDevice(options.device));
  if (options.dummy_weights != (ckpt == nullptr)) {
    return absl::InvalidArgumentError(
        "MakeAttentionBackend: a checkpoint iff the weights are not dummy");
  }
  if (options.dummy_weights && !IsCudaDevice(options.device)) {
    return absl::FailedPreconditionError(
        "--load_format dummy generates the weights on a GPU: it needs --device cuda");
  }
  RETURN_IF_ERROR(CheckQuantization(config, options));
  ASSIGN_OR_RETURN(const KvRowFormat kv_format, KvRowFormatFor(config, options));
  if (IsCudaDevice(options.device)) {
    ASSIGN_OR_RETURN(const CudaBackendsTable* cuda, CudaBackends());
    if (options.prefix_cache && config.family == ModelFamily::kDeepseekV4) {
      std::cerr << "prefix cache: off for DeepSeek-V4 on " << options.device
                << " (its compressed entries share the cache's block ids at other rows, so "
                   "blocks cannot be shared); every prompt is computed whole"
                << std::endl;
    }
    return cuda->make_attention_backend(config, ckpt, options, with_experts);
  }
  if (with_experts)
    return absl::InvalidArgumentError(
        "the CPU attention backend takes its experts as an ExpertClient");
  if (options.num_kv_blocks < 0 || options.block_size < 1) {
    return absl::InvalidArgumentError("the KV pool needs num_kv_blocks >= 0 and block_size >= 1");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<AttentionWeights> weights,
                   AttentionWeights::Load(config, *ckpt));
  return NewCpuAttentionBackend(std::make_unique<AttentionModel>(config, std::move(weights)),
                                options.num_kv_blocks, options.block_size,
                                options.prefix_cache && options.num_kv_blocks > 0, kv_format);
}

absl::StatusOr<std::unique_ptr<ExpertStage>> MakeExpertStage(
    const ModelConfig& config, std::unique_ptr<ExpertShardWeights> weights,
    const DeviceOptions& options) {
  RETURN_IF_ERROR(ValidateDevice(options.device));
  RETURN_IF_ERROR(CheckQuantization(config, options));
  RETURN_IF_ERROR(KvRowFormatFor(config, options).status());  // the same refusals as attention's
  if (IsCudaDevice(options.device)) {
    ASSIGN_OR_RETURN(const CudaBackendsTable* cuda, CudaBackends());
    return cuda->make_expert_stage(config, std::move(weights), options);
  }
  if (options.dummy_weights) {
    return absl::FailedPreconditionError(
        "--load_format dummy generates the weights on a GPU: it needs --device cuda");
  }
  if (weights != nullptr && weights->deferred != nullptr) {
    return absl::InvalidArgumentError(
        "the CPU expert stage computes from float32 weights: load them (ExpertShardWeights::Load), "
        "not Deferred");
  }
  return std::make_unique<ExpertStage>(config, std::move(weights));
}

}  // namespace moesh
