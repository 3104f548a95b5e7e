// The "normalizer" of a tokenizer.json. Supported: null, {"type": "NFC"}, and
// {"type": "Sequence", "normalizers": [...]} of those (DeepSeek-V3 ships an empty
// Sequence). NFC comes from ICU. Immutable after FromJson; thread-safe.
#ifndef MOESH_COMMON_TOKENIZER_NORMALIZER_H_
#define MOESH_COMMON_TOKENIZER_NORMALIZER_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/json_field.h"

namespace moesh {

class Normalizer {
 public:
  // INVALID_ARGUMENT naming the file, field and type for anything unsupported.
  static absl::StatusOr<Normalizer> FromJson(const JsonField& normalizer);

  // True iff Normalize can change text.
  bool active() const { return nfc_; }
  // REQUIRES: text is well-formed UTF-8. Returns it normalized (well-formed UTF-8).
  std::string Normalize(absl::string_view text) const;

 private:
  bool nfc_ = false;
};

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_NORMALIZER_H_
