// moesh mkmodel: write a random checkpoint in DeepSeek's on-disk format.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/base/file_util.h"
#include "common/base/status.h"
#include "common/model/random_checkpoint.h"
#include "common/tokenizer/embedded_tokenizers.h"

namespace moesh::cli {

absl::Status RunMkmodel(const std::vector<std::string>& argv) {
  ASSIGN_OR_RETURN(
      Args args, Args::Parse(argv, {"family", "preset", "out", "seed", "shards", "dtype", "layers"},
                             {"rope-parameters", "config-only"}));
  ASSIGN_OR_RETURN(std::string family, args.Required("family"));
  ASSIGN_OR_RETURN(std::string out, args.Required("out"));
  ASSIGN_OR_RETURN(ModelConfig config, PresetConfig(family, args.Get("preset").value_or("tiny")));
  // The preset's shapes at another depth (e.g. DeepSeek-V3's layers, as
  // many as fit the GPUs at hand).
  ASSIGN_OR_RETURN(int64_t layers, args.Int("layers", config.num_hidden_layers));
  if (layers < 1 || layers > 1000)
    return absl::InvalidArgumentError("--layers must lie in [1, 1000]");
  if (layers != config.num_hidden_layers) {
    if (config.is_v4()) {  // the first `layers` layers' types (more: HCA and CSA alternating,
                           // learned routing)
      for (int l = config.num_hidden_layers; l < layers; ++l) {
        config.layer_types.push_back(l % 2 ? V4AttentionType::kCompressedSparse
                                           : V4AttentionType::kHeavilyCompressed);
        config.hash_layers.push_back(false);
      }
      config.layer_types.resize(layers);
      config.hash_layers.resize(layers);
    }
    config.num_hidden_layers = static_cast<int>(layers);
    RETURN_IF_ERROR(config.Validate(absl::StrCat("--layers ", layers)));
  }
  RandomCheckpointOptions opt;
  ASSIGN_OR_RETURN(int64_t seed, args.Int("seed", 0));
  ASSIGN_OR_RETURN(int64_t shards, args.Int("shards", 1));
  if (shards < 1 || shards > 1000)
    return absl::InvalidArgumentError("--shards must lie in [1, 1000]");
  opt.seed = static_cast<uint64_t>(seed);
  opt.num_shards = static_cast<int>(shards);
  ASSIGN_OR_RETURN(opt.dtype, ParseDType(args.Get("dtype").value_or("BF16")));
  opt.new_rope_form = args.Bool("rope-parameters");
  opt.tokenizer_json =
      std::string(EmbeddedTokenizerJson(args.Get("preset").value_or("tiny")).value_or(""));
  if (args.Bool("config-only")) {  // for --load_format dummy: the shapes, no weights
    RETURN_IF_ERROR(MakeDirs(out));
    RETURN_IF_ERROR(
        WriteStringToFile(JoinPath(out, "config.json"), config.ToJson(opt.new_rope_form)));
    std::cout << "wrote " << JoinPath(out, "config.json") << " (" << family << "/"
              << args.Get("preset").value_or("tiny") << ", no weights)\n";
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(WriteRandomCheckpoint(config, out, opt));
  std::cout << "wrote " << config.model_type << " (" << family << "/"
            << args.Get("preset").value_or("tiny") << ") to " << out << "\n";
  return absl::OkStatus();
}

}  // namespace moesh::cli
