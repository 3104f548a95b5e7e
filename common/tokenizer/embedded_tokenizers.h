// The tokenizer.json files that `moesh mkmodel` writes beside its random checkpoints,
// compiled into the binary (from tests/golden/tokenizer/<preset>/tokenizer.json, made by
// tests/golden/tokenizer/make_tokenizer_golden.py), so nothing is read from the source
// tree at run time. DeepSeek-V3-style byte-level BPE; BOS id 0, EOS id 1, matching the
// presets' bos_token_id / eos_token_id.
#ifndef MOESH_COMMON_TOKENIZER_EMBEDDED_TOKENIZERS_H_
#define MOESH_COMMON_TOKENIZER_EMBEDDED_TOKENIZERS_H_

#include <optional>

#include "absl/strings/string_view.h"

namespace moesh {

// "tiny" -> the 512-token tokenizer, "small" -> the 8192-token one (each no larger
// than that preset's vocab_size); nullopt for any other preset. The view is static.
std::optional<absl::string_view> EmbeddedTokenizerJson(absl::string_view preset);

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_EMBEDDED_TOKENIZERS_H_
