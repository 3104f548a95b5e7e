// A byte-level BPE tokenizer read from a Hugging Face tokenizer.json as DeepSeek ships
// it (V2, V3, R1): added/special tokens, normalizer (none or NFC), Split regexes +
// ByteLevel pre-tokenizer, BPE model, TemplateProcessing post-processor, ByteLevel
// decoder. Encode and Decode give exactly what the `tokenizers` library gives (proven
// against it by tests/golden/tokenizer). Anything in the file this code does not
// implement is refused at Load with INVALID_ARGUMENT naming the file and the field.
//
// Thread-safe: immutable after Load.
#ifndef MOESH_COMMON_TOKENIZER_TOKENIZER_H_
#define MOESH_COMMON_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/tokenizer/added_vocabulary.h"
#include "common/tokenizer/bpe_model.h"
#include "common/tokenizer/normalizer.h"
#include "common/tokenizer/post_processor.h"
#include "common/tokenizer/pre_tokenizer.h"

namespace moesh {

class Tokenizer {
 public:
  // Reads `path_or_dir`, or <path_or_dir>/tokenizer.json if it is a directory.
  // NOT_FOUND if there is no such file; INVALID_ARGUMENT if it is not JSON or holds
  // something unsupported.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(const std::string& path_or_dir);
  // The same from the file's contents; `name` stands for the file in messages.
  static absl::StatusOr<std::unique_ptr<Tokenizer>> FromJson(absl::string_view json,
                                                             const std::string& name);

  // The ids of `text`; with add_special_tokens, wrapped as the post_processor says
  // (DeepSeek: BOS first). Added tokens written in the text (e.g. "<｜User｜>") become
  // their ids. INVALID_ARGUMENT if `text` is not well-formed UTF-8.
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const;

  // The text of `ids`; ill-formed UTF-8 (e.g. a lone piece of a character) becomes
  // U+FFFD. Unknown ids are skipped, special tokens too if skip_special_tokens.
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const;

  // Appends the bytes id stands for (nothing for unknown ids, or for special tokens if
  // skip_special_tokens); Decode is the lossy UTF-8 reading of all of them together.
  void AppendTokenBytes(int32_t id, bool skip_special_tokens, std::string* out) const;

  // One more than the largest id of any token (the model's vocab_size must be >= this).
  int vocab_size() const { return vocab_size_; }
  // The id of token `token` (added tokens by their content, else the BPE vocabulary's
  // byte-level spelling, e.g. "Ġthe"), or nullopt.
  std::optional<int32_t> TokenId(absl::string_view token) const;
  // The token's spelling, or nullopt for unknown ids.
  std::optional<std::string> TokenText(int32_t id) const;
  // True iff id is an added token marked special.
  bool IsSpecial(int32_t id) const;

 private:
  Tokenizer(BpeModel model, AddedVocabulary added, Normalizer normalizer,
            PreTokenizer pre_tokenizer, PostProcessor post_processor);

  void EncodePlain(absl::string_view text, std::vector<int32_t>* ids) const;

  const BpeModel model_;
  const AddedVocabulary added_;
  const Normalizer normalizer_;
  const PreTokenizer pre_tokenizer_;
  const PostProcessor post_processor_;
  int vocab_size_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_TOKENIZER_H_
