// The "post_processor" of a tokenizer.json, for single sequences: which special ids
// encoding with add_special_tokens puts around the text (DeepSeek: BOS before it).
// Supported: null (nothing added), {"type": "TemplateProcessing"} (its "single"
// template of SpecialToken / Sequence "A" pieces, ids from its "special_tokens"),
// {"type": "ByteLevel"} (offsets only, so nothing for ids), and a "Sequence" of those
// ("processors", at most one TemplateProcessing). INVALID_ARGUMENT naming the file and
// field otherwise. Immutable after FromJson; thread-safe.
#ifndef MOESH_COMMON_TOKENIZER_POST_PROCESSOR_H_
#define MOESH_COMMON_TOKENIZER_POST_PROCESSOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/json_field.h"

namespace moesh {

class PostProcessor {
 public:
  static absl::StatusOr<PostProcessor> FromJson(const JsonField& post_processor);

  // The ids of the template around `ids` (moved in).
  std::vector<int32_t> AddSpecialTokens(std::vector<int32_t> ids) const;
  // Every id the template adds.
  std::vector<int32_t> TemplateIds() const { return AddSpecialTokens({}); }

 private:
  absl::Status ParseTemplate(const JsonField& f);

  bool has_template_ = false;
  std::vector<int32_t> before_;  // ids before the sequence
  std::vector<int32_t> after_;   // ids after it
};

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_POST_PROCESSOR_H_
