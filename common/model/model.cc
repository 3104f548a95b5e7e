#include "common/model/model.h"

#include "base/status.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"

namespace moesh {

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir) {
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  RETURN_IF_ERROR(ValidateCheckpoint(config, *ckpt));
  ASSIGN_OR_RETURN(std::unique_ptr<AttentionWeights> attn, AttentionWeights::Load(config, *ckpt));
  ASSIGN_OR_RETURN(std::unique_ptr<ExpertShardWeights> experts,
                   ExpertShardWeights::Load(config, *ckpt, /*expert_ids=*/{}));
  auto stage = std::make_unique<ExpertStage>(config, std::move(experts));
  return std::unique_ptr<Model>(new Model(std::make_unique<AttentionModel>(config, std::move(attn)),
                                          std::make_unique<LocalExpertClient>(std::move(stage))));
}

}  // namespace moesh
