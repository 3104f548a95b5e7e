// UTF-8 decoding, validation and lossy repair, byte-exact with Rust's
// String::from_utf8_lossy (which Hugging Face tokenizers' ByteLevel decoder uses):
// every "maximal subpart" of an ill-formed sequence becomes one U+FFFD
// (Unicode 15, section 3.9, "U+FFFD Substitution of Maximal Subparts").
// All functions are pure and thread-safe.
#ifndef MOESH_COMMON_TOKENIZER_UTF8_H_
#define MOESH_COMMON_TOKENIZER_UTF8_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace moesh {

// The outcome of decoding one character at some position of a byte string.
struct Utf8Step {
  enum Kind { kValid, kInvalid, kIncomplete };
  Kind kind;
  // kValid: bytes of the character; kInvalid: bytes of the maximal subpart (>= 1);
  // kIncomplete: bytes left before the end, all a valid prefix of a character (>= 1).
  size_t length;
  char32_t code_point;  // kValid only
};

// REQUIRES: pos < bytes.size().
Utf8Step DecodeUtf8At(absl::string_view bytes, size_t pos);

// OK iff `bytes` is well-formed UTF-8 (no overlongs, surrogates or values past U+10FFFF);
// else INVALID_ARGUMENT naming the byte offset of the first bad sequence.
absl::Status ValidateUtf8(absl::string_view bytes);

// Code points of well-formed `text`, and the byte offset of each one plus a final
// text.size() entry: offsets->size() == code_points->size() + 1.
// REQUIRES: ValidateUtf8(text).ok().
void DecodeUtf8(absl::string_view text, std::vector<char32_t>* code_points,
                std::vector<size_t>* offsets);

// Appends the UTF-8 encoding of `c`. REQUIRES: c <= 0x10FFFF and not a surrogate.
void AppendUtf8(char32_t c, std::string* out);

// Appends `bytes` to `out` with each maximal ill-formed subpart replaced by U+FFFD,
// and returns how many bytes of `bytes` it consumed. If `final` is false, a trailing
// incomplete character (a valid prefix cut by the end) is left unconsumed so that
// the caller can retry once more bytes arrive; if true, it becomes one U+FFFD.
size_t AppendUtf8Lossy(absl::string_view bytes, bool final, std::string* out);

// The whole of `bytes`, repaired as above (final = true).
std::string Utf8Lossy(absl::string_view bytes);

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_UTF8_H_
