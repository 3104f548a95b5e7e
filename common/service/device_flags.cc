#include "common/service/device_flags.h"

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

ABSL_FLAG(std::string, device, moesh::DeviceOptions().device,
          "Where to compute: cpu, cuda (the current GPU) or cuda:N.");
ABSL_FLAG(
    double, gpu_memory_utilization, moesh::DeviceOptions().gpu_memory_utilization,
    "--device cuda: the fraction of the GPU's memory this process may bring the total to (weights, "
    "scratch, then the KV cache); other processes' memory counts.");
ABSL_FLAG(int, max_model_len, moesh::DeviceOptions().max_model_len,
          "--device cuda: tokens per sequence (0: min(max_position_embeddings, 8192)).");
ABSL_FLAG(
    std::string, load_format, "auto",
    "auto: the checkpoint's weights; dummy: random weights made on the GPU from config.json alone "
    "(benchmarks at real shapes; --device cuda).");

ABSL_FLAG(std::string, quantization, "",
          "fp8: quantize a bf16 checkpoint's dense linears to DeepSeek's block-scaled FP8 at load "
          "(128 x 128 weight blocks, activations per token per 128 channels; --device cuda). "
          "Empty: the checkpoint's own format (an FP8 checkpoint runs in FP8).");

ABSL_FLAG(std::string, kv_cache_dtype, "auto",
          "auto: the KV cache in the device's own precision (float32 on the CPU, bf16 on CUDA). "
          "fp8: FlashMLA's FP8 layout (the latent part in e4m3 with a power-of-two scale per "
          "128 values, the rope part in bf16): 656 bytes a token at DeepSeek-V3's widths against "
          "1152 in bf16. DeepSeek-V2, V3 and V3.2 families (not V4); prefill and "
          "decode workers must agree.");

namespace moesh {

absl::StatusOr<DeviceOptions> DeviceOptionsFromFlags() {
  DeviceOptions o;
  o.device = absl::GetFlag(FLAGS_device);
  RETURN_IF_ERROR(ValidateDevice(o.device));
  o.gpu_memory_utilization = absl::GetFlag(FLAGS_gpu_memory_utilization);
  if (!(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu_memory_utilization must be in (0, 1], got ", o.gpu_memory_utilization));
  }
  o.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  if (o.max_model_len < 0) return absl::InvalidArgumentError("--max_model_len must be >= 0");
  const std::string load = absl::GetFlag(FLAGS_load_format);
  if (load != "auto" && load != "dummy") {
    return absl::InvalidArgumentError("--load_format must be auto or dummy, not \"" + load + "\"");
  }
  o.dummy_weights = load == "dummy";
  const std::string quantization = absl::GetFlag(FLAGS_quantization);
  if (!quantization.empty() && quantization != "fp8") {
    return absl::InvalidArgumentError("--quantization must be fp8 or empty, not \"" + quantization +
                                      "\"");
  }
  o.fp8_linears = quantization == "fp8";
  if (o.fp8_linears && !IsCudaDevice(o.device)) {
    return absl::InvalidArgumentError(
        "--quantization fp8 computes on FP8 tensor cores: it needs --device cuda");
  }
  const std::string kv_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  if (kv_dtype != "auto" && kv_dtype != "fp8") {
    return absl::InvalidArgumentError("--kv_cache_dtype must be auto or fp8, not \"" + kv_dtype +
                                      "\"");
  }
  o.fp8_kv_cache = kv_dtype == "fp8";
  if (o.dummy_weights && !IsCudaDevice(o.device)) {
    return absl::InvalidArgumentError(
        "--load_format dummy generates the weights on a GPU: it needs --device cuda");
  }
  return o;
}

}  // namespace moesh
