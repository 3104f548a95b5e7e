// The "pre_tokenizer" of a byte-level tokenizer.json: Split steps, then ByteLevel.
// Supported: {"type": "Sequence", "pretokenizers": [Split..., ByteLevel]} or a lone
// ByteLevel, where
//   Split:     pattern {"Regex": ...} (see split_regex.h) or {"String": ...},
//              behavior "Isolated", invert false;
//   ByteLevel: add_prefix_space false, use_regex false, and last.
// Each Split refines every piece the earlier steps made, seeing one piece at a time (so
// a look-ahead at a piece's end sees nothing), and keeps both the matches and the gaps
// between them, as tokenizers' Split does. INVALID_ARGUMENT naming the file and field
// for anything else. Immutable after FromJson; thread-safe.
#ifndef MOESH_COMMON_TOKENIZER_PRE_TOKENIZER_H_
#define MOESH_COMMON_TOKENIZER_PRE_TOKENIZER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/json_field.h"
#include "common/tokenizer/split_regex.h"

namespace moesh {

class PreTokenizer {
 public:
  static absl::StatusOr<PreTokenizer> FromJson(const JsonField& pre_tokenizer);
  // A pre-tokenizer of these Split steps (for tests).
  explicit PreTokenizer(std::vector<SplitRegex> splits) : splits_(std::move(splits)) {}

  // Appends the non-empty pieces of `text` in order (they concatenate to `text`); the
  // byte-level mapping is left to the caller. REQUIRES: text is well-formed UTF-8.
  void Split(absl::string_view text, std::vector<absl::string_view>* pieces) const;

 private:
  PreTokenizer() = default;
  std::vector<SplitRegex> splits_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_PRE_TOKENIZER_H_
