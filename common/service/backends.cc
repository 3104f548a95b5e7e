#include "common/service/backends.h"

#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace moesh {

bool IsCudaDevice(const std::string& device) { return device == "cuda" || absl::StartsWith(device, "cuda:"); }

absl::Status ValidateDevice(const std::string& device) {
  if (device == "cpu" || device == "cuda") return absl::OkStatus();
  int ordinal = -1;
  if (absl::StartsWith(device, "cuda:") && absl::SimpleAtoi(device.substr(5), &ordinal) && ordinal >= 0) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("--device must be cpu, cuda or cuda:N, not \"", device, "\""));
}

absl::StatusOr<std::unique_ptr<AttentionBackend>> MakeAttentionBackend(const ModelConfig& config,
                                                                       const Checkpoint& ckpt,
                                                                       const DeviceOptions& options,
                                                                       bool with_experts) {
  RETURN_IF_ERROR(ValidateDevice(options.device));
  if (IsCudaDevice(options.device)) return MakeCudaAttentionBackend(config, ckpt, options, with_experts);
  if (with_experts) return absl::InvalidArgumentError("the CPU attention backend takes its experts as an ExpertClient");
  if (options.num_kv_blocks < 0 || options.block_size < 1) {
    return absl::InvalidArgumentError("the KV pool needs num_kv_blocks >= 0 and block_size >= 1");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<AttentionWeights> weights, AttentionWeights::Load(config, ckpt));
  return NewCpuAttentionBackend(std::make_unique<AttentionModel>(config, std::move(weights)), options.num_kv_blocks,
                                options.block_size);
}

absl::StatusOr<std::unique_ptr<ExpertStage>> MakeExpertStage(const ModelConfig& config,
                                                             std::unique_ptr<ExpertShardWeights> weights,
                                                             const DeviceOptions& options) {
  RETURN_IF_ERROR(ValidateDevice(options.device));
  if (IsCudaDevice(options.device)) return MakeCudaExpertStage(config, std::move(weights), options);
  return std::make_unique<ExpertStage>(config, std::move(weights));
}

}  // namespace moesh
