// moesh mkmodel: write a random checkpoint in DeepSeek's on-disk format.
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "common/model/random_checkpoint.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/embedded_tokenizers.h"

ABSL_FLAG(std::string, family, "", "The model family: v2-lite, v2, v3, v3.2 or v4.");
ABSL_FLAG(std::string, preset, "tiny",
          "Its shapes: tiny, small or real (the published model's; large, so usually with "
          "--config_only).");
ABSL_FLAG(std::string, out, "", "The directory to write the checkpoint to (created).");
ABSL_FLAG(int, shards, 1, "Safetensors files to split the weights over (1 to 1000).");
ABSL_FLAG(std::string, dtype, "BF16",
          "The weights' dtype: BF16, F16, F32, or FP8 (F8_E4M3: block-scaled as DeepSeek-V3 "
          "ships it, config.json's quantization_config set; for --family v4 as V4-Flash ships "
          "it: FP8 linears with ue8m0 block scales and MXFP4 routed experts; with --config_only, "
          "dummy weights are made in FP8).");
ABSL_FLAG(std::optional<int>, layers, std::nullopt,
          "Layers, when not the preset's: its shapes at another depth (1 to 1000).");
ABSL_FLAG(bool, rope_parameters, false,
          "Write RoPE settings in config.json's newer rope_parameters form.");
ABSL_FLAG(bool, config_only, false,
          "Write config.json alone, no weights (for --load_format dummy).");

namespace moesh::cli {

absl::Status RunMkmodel() {
  const std::string family = absl::GetFlag(FLAGS_family);
  if (family.empty()) return absl::InvalidArgumentError("--family is required");
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return absl::InvalidArgumentError("--out is required");
  const std::string preset = absl::GetFlag(FLAGS_preset);
  ASSIGN_OR_RETURN(ModelConfig config, PresetConfig(family, preset));
  // The preset's shapes at another depth (e.g. DeepSeek-V3's layers, as
  // many as fit the GPUs at hand).
  const int layers = absl::GetFlag(FLAGS_layers).value_or(config.num_hidden_layers);
  if (layers < 1 || layers > 1000)
    return absl::InvalidArgumentError("--layers must lie in [1, 1000]");
  if (layers != config.num_hidden_layers) {
    if (config.layers() == LayerArch::kV4) {  // the first `layers` layers' types (more: HCA and CSA
                                              // alternating, learned routing)
      for (int l = config.num_hidden_layers; l < layers; ++l) {
        config.v4.layer_types.push_back(l % 2 ? V4AttentionType::kCompressedSparse
                                              : V4AttentionType::kHeavilyCompressed);
        config.v4.hash_layers.push_back(false);
      }
      config.v4.layer_types.resize(layers);
      config.v4.hash_layers.resize(layers);
    }
    config.num_hidden_layers = layers;
    RETURN_IF_ERROR(config.Validate(absl::StrCat("--layers ", layers)));
  }
  RandomCheckpointOptions opt;
  const int shards = absl::GetFlag(FLAGS_shards);
  if (shards < 1 || shards > 1000)
    return absl::InvalidArgumentError("--shards must lie in [1, 1000]");
  opt.seed = absl::GetFlag(FLAGS_seed).value_or(0);
  opt.num_shards = shards;
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  ASSIGN_OR_RETURN(opt.dtype, ParseDType(dtype == "FP8" || dtype == "fp8" ? "F8_E4M3" : dtype));
  if (opt.dtype == DType::kF8E4M3) {
    config.fp8_block_weights = true;
    config.mxfp4_experts = config.layers() == LayerArch::kV4;  // V4-Flash's routed experts
    RETURN_IF_ERROR(config.Validate("--dtype FP8"));
  }
  opt.new_rope_form = absl::GetFlag(FLAGS_rope_parameters);
  opt.tokenizer_json = std::string(EmbeddedTokenizerJson(preset).value_or(""));
  if (absl::GetFlag(FLAGS_config_only)) {  // for --load_format dummy: the shapes, no weights
    RETURN_IF_ERROR(MakeDirs(out));
    RETURN_IF_ERROR(
        WriteStringToFile(JoinPath(out, "config.json"), config.ToJson(opt.new_rope_form)));
    std::cout << "wrote " << JoinPath(out, "config.json") << " (" << family << "/" << preset
              << ", no weights)\n";
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(WriteRandomCheckpoint(config, out, opt));
  if (!opt.tokenizer_json.empty()) {  // the tokenizers have DeepSeek's special tokens: chat too
    // V3.2 and V4 ship no chat template: the router renders their encoders' format.
    const bool own_encoder =
        config.model_type == "deepseek_v32" || config.model_type == "deepseek_v4";
    RETURN_IF_ERROR(WriteStringToFile(JoinPath(out, "tokenizer_config.json"),
                                      DeepSeekTokenizerConfigJson(!own_encoder)));
  }
  std::cout << "wrote " << config.model_type << " (" << family << "/" << preset << ") to " << out
            << "\n";
  return absl::OkStatus();
}

}  // namespace moesh::cli
