// A whole model in one process: the attention half plus every routed expert
// behind a LocalExpertClient. This is the colocated mode, `moesh generate`'s
// engine, and the reference the disaggregated cluster must equal.
#ifndef MOESH_COMMON_MODEL_MODEL_H_
#define MOESH_COMMON_MODEL_MODEL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/attention_model.h"
#include "common/model/config.h"
#include "common/model/expert_client.h"

namespace moesh {

class Model {
 public:
  // Loads <dir>/config.json and its safetensors, validating the whole
  // checkpoint first (see ValidateCheckpoint).
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir);

  const ModelConfig& config() const { return attention_->config(); }
  const AttentionModel& attention() const { return *attention_; }
  ExpertClient* experts() const { return experts_.get(); }

  SequenceKvCache NewCache() const { return attention_->NewCache(); }
  absl::StatusOr<std::vector<float>> Forward(absl::Span<const SequenceInput> seqs,
                                             LogitsFor which = LogitsFor::kLastToken) const {
    return attention_->Forward(seqs, experts_.get(), which);
  }

 private:
  Model(std::unique_ptr<AttentionModel> attention, std::unique_ptr<ExpertClient> experts)
      : attention_(std::move(attention)), experts_(std::move(experts)) {}

  const std::unique_ptr<AttentionModel> attention_;
  const std::unique_ptr<ExpertClient> experts_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_MODEL_H_
