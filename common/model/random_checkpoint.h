// Random checkpoints in the exact on-disk format DeepSeek ships (config.json +
// bf16 safetensors with DeepSeek tensor names), for the embedded default
// model, tests and benchmarks without downloads.
#ifndef MOESH_COMMON_MODEL_RANDOM_CHECKPOINT_H_
#define MOESH_COMMON_MODEL_RANDOM_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "base/dtype.h"
#include "common/model/config.h"

namespace moesh {

// family: "v2-lite" | "v2" | "v3" | "v3.2" | "v4"; preset: "tiny" | "small",
// or "real" (the published model's own shapes: v2-lite (16B parameters), v3
// (671B; V3 and R1 share them), v3.2 (V3.2-Exp: v3 plus the indexer) and v4
// (V4-Flash, transformers' DeepseekV4Config defaults)).
// INVALID_ARGUMENT listing the choices otherwise.
absl::StatusOr<ModelConfig> PresetConfig(const std::string& family, const std::string& preset);

struct RandomCheckpointOptions {
  uint64_t seed = 0;
  int num_shards = 1;
  // kBF16, kF16, kF32, or kF8E4M3: DeepSeek-V3's shipped FP8 (IsFp8Linear's
  // tensors e4m3 with a weight_scale_inv per 128 x 128 block, the rest bf16,
  // config.json's quantization_config set); for V4, V4-Flash's shipped
  // format: IsV4Fp8Linear's tensors e4m3 with a ue8m0 "<x>.scale" per block,
  // the routed experts MXFP4 (I8 e2m1 pairs, F8_E8M0 "<x>.scale" per 32
  // inputs), the rest (compressors, indexer weights_proj, router) bf16.
  DType dtype = DType::kBF16;
  float std = 0.05f;           // weights ~ N(0, std); norms ~ 1 + N(0, 0.1)
  bool new_rope_form = false;  // write rope_parameters instead of rope_theta/rope_scaling
  std::string tokenizer_json;  // written as <dir>/tokenizer.json unless empty
};

// The tensors DeepSeek-V3/R1/V3.2 ship in block-scaled FP8: every linear
// projection (attention, dense MLPs, shared and routed experts, the V3.2
// indexer's wq_b and wk) but the indexer's weights_proj.
bool IsFp8Linear(const std::string& name);
// The tensors DeepSeek-V4 ships in block-scaled FP8: the attention's wq_a,
// wq_b, wkv, wo_a, wo_b, the indexer's wq_b and the shared experts (the
// compressors and the indexer's weights_proj are bf16; the routed experts
// MXFP4).
bool IsV4Fp8Linear(const std::string& name);

// Writes <dir>/config.json, the safetensors (one file or shards + index) and, if
// options.tokenizer_json is set, tokenizer.json.
absl::Status WriteRandomCheckpoint(const ModelConfig& config, const std::string& dir,
                                   const RandomCheckpointOptions& options);

// Writes <out_dir>/config.json and model.safetensors: the checkpoint in `dir`
// with every fp32 tensor rounded to bf16 values (dtype kept) but those the
// CUDA model keeps in fp32 (routers and their biases, V4's mHC mappings,
// compressor ape and attention sinks, V3.2's indexer key norm): the weights
// the GPU computes with, for the CPU engine to run on (cuda_model_test,
// tests/golden/bf16_drift.cc). Checkpoints stored in bf16 come out unchanged.
absl::Status WriteBf16RoundedCopy(const std::string& dir, const std::string& out_dir);

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_RANDOM_CHECKPOINT_H_
