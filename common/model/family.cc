#include "common/model/family.h"

#include <iterator>

namespace moesh {
namespace {

// One row per family; TraitsOf indexes it by ModelFamily.
constexpr FamilyTraits kFamilies[] = {
    {ModelFamily::kDeepseekV2, "deepseek_v2", "DeepseekV2ForCausalLM", LayerArch::kMla,
     /*indexer=*/false, /*rope_interleave_option=*/false, TopkMethod::kGreedy,
     ScoringFunc::kSoftmax},
    {ModelFamily::kDeepseekV3, "deepseek_v3", "DeepseekV3ForCausalLM", LayerArch::kMla,
     /*indexer=*/false, /*rope_interleave_option=*/true, TopkMethod::kNoauxTc,
     ScoringFunc::kSigmoid},
    {ModelFamily::kDeepseekV32, "deepseek_v32", "DeepseekV32ForCausalLM", LayerArch::kMla,
     /*indexer=*/true, /*rope_interleave_option=*/false, TopkMethod::kNoauxTc,
     ScoringFunc::kSigmoid},
    {ModelFamily::kDeepseekV4, "deepseek_v4", "DeepseekV4ForCausalLM", LayerArch::kV4,
     /*indexer=*/false, /*rope_interleave_option=*/false, TopkMethod::kGreedy,
     ScoringFunc::kSqrtSoftplus},
};

}  // namespace

const FamilyTraits& TraitsOf(ModelFamily family) {
  for (const FamilyTraits& t : kFamilies) {
    if (t.id == family) return t;
  }
  return kFamilies[0];  // unreachable for a ModelFamily value
}

const FamilyTraits* FindFamily(std::string_view model_type) {
  for (const FamilyTraits& t : kFamilies) {
    if (t.model_type == model_type) return &t;
  }
  return nullptr;
}

std::string SupportedModelTypes() {
  std::string out;
  for (const FamilyTraits& t : kFamilies) {
    if (!out.empty()) out += ", ";
    out += t.model_type;
  }
  return out;
}

}  // namespace moesh
