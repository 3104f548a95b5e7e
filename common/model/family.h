// The DeepSeek families side by side: what each is called, which layer
// architecture runs it, and which family parts of ModelConfig it has. Code
// that differs by family asks these traits (or dispatches once on `layers`:
// the CPU forward pass, the checkpoint schema, the device weights, the CUDA
// layer stack) instead of comparing ModelFamily values. Adding a family is a
// row in family.cc plus its parts (config section, weights, layers).
#ifndef MOESH_COMMON_MODEL_FAMILY_H_
#define MOESH_COMMON_MODEL_FAMILY_H_

#include <string>
#include <string_view>

namespace moesh {

// kDeepseekV32: V3 plus the DSA lightning indexer (sparse attention over the
// index_topk cached tokens an indexer scores highest).
// kDeepseekV4: mHC residual streams, shared-KV MQA with a sliding window plus
// compressed (CSA / HCA) attention, sqrt-softplus and hash routing.
enum class ModelFamily { kDeepseekV2, kDeepseekV3, kDeepseekV32, kDeepseekV4 };
enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc };
enum class ScoringFunc { kSoftmax, kSigmoid, kSqrtSoftplus };

// The layers a family runs.
enum class LayerArch {
  // MLA over a latent cache, then a dense MLP or MoE (V2, V2-Lite, V3/R1,
  // V3.2): common/model/attention_model.cc, common/cuda_backend/mla/mla_layer_stack.
  kMla,
  // mHC residual streams, sliding-window plus compressed attention, then MoE
  // (V4): common/model/v4/v4_model.cc, common/cuda_backend/v4/v4_layer_stack.
  kV4,
};

struct FamilyTraits {
  ModelFamily id;
  std::string_view model_type;    // config.json's model_type
  std::string_view architecture;  // config.json's architectures[0]
  LayerArch layers;
  // The lightning indexer chooses each query's cache rows (ModelConfig::indexer
  // is required; V3.2). V4's CSA layers have one too, per layer (config_v4.cc).
  bool indexer;
  // config.json's rope_interleave is read (V3); the others always rotate
  // interleaved pairs as transformers does, whatever the file says.
  bool rope_interleave_option;
  // The router's defaults where config.json does not say.
  TopkMethod default_topk_method;
  ScoringFunc default_scoring_func;
};

// REQUIRES: a ModelFamily value.
const FamilyTraits& TraitsOf(ModelFamily family);
// The family of a config.json model_type; null if none is.
const FamilyTraits* FindFamily(std::string_view model_type);
// The model_types FindFamily knows, comma-separated (error messages).
std::string SupportedModelTypes();

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_FAMILY_H_
