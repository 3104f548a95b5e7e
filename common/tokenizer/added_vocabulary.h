// The "added_tokens" of a tokenizer.json (special tokens such as
// <｜begin▁of▁sentence｜>, and other added tokens), and how encoding cuts them out of
// text before the BPE model sees it, as tokenizers' AddedVocabulary does: tokens with
// normalized=false are found in the raw text, those with normalized=true in the
// normalized text (matching their normalized content); at each position the leftmost,
// then longest, token wins. single_word, lstrip and rstrip must be false.
// Immutable after FromJson; thread-safe.
#ifndef MOESH_COMMON_TOKENIZER_ADDED_VOCABULARY_H_
#define MOESH_COMMON_TOKENIZER_ADDED_VOCABULARY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/json_field.h"
#include "common/tokenizer/normalizer.h"

namespace moesh {

struct AddedToken {
  int32_t id;
  std::string content;  // as the file has it
  std::string text;     // what it matches and decodes to: content, normalized iff `normalized`
  bool special;
  bool normalized;
};

// A stretch of text: an added token (id >= 0) or text for the model (id == -1).
struct TextSegment {
  absl::string_view text;
  int32_t id;
};

class AddedVocabulary {
 public:
  // A token whose content is in the model's vocabulary must carry that id; any other id
  // must be unused by the model. INVALID_ARGUMENT naming the file and field otherwise.
  static absl::StatusOr<AddedVocabulary> FromJson(const JsonField& added_tokens,
                                                  const BpeModel& model,
                                                  const Normalizer& normalizer);

  // Appends the segments of `text`, matching the tokens with `normalized` equal to the
  // argument; plain segments are non-empty and keep their order.
  void Split(absl::string_view text, bool normalized, std::vector<TextSegment>* out) const;

  const AddedToken* FindById(int32_t id) const;
  std::optional<int32_t> FindByContent(absl::string_view content) const;
  int32_t max_id() const { return max_id_; }

 private:
  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;           // id -> index in tokens_
  absl::flat_hash_map<std::string, size_t> by_content_;  // content -> index
  // For each first byte, the indices of the tokens of each kind (normalized or not)
  // whose text starts with it, longest first.
  std::vector<size_t> by_first_byte_[2][256];
  int32_t max_id_ = -1;
};

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_ADDED_VOCABULARY_H_
