// GPT-2's byte-level alphabet, as Hugging Face's ByteLevel pre-tokenizer and decoder use
// it: every byte is shown as one printable code point (printable Latin-1 bytes as
// themselves, the other 68 as U+0100.. in byte order; a space is "Ġ", U+0120).
// Thread-safe (the tables are built once).
#ifndef MOESH_COMMON_TOKENIZER_BYTE_LEVEL_H_
#define MOESH_COMMON_TOKENIZER_BYTE_LEVEL_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace moesh {

// The UTF-8 form of the code point that shows byte `b`.
const std::string& ByteLevelChar(uint8_t b);

// Appends the byte-level form of `bytes` (each byte's ByteLevelChar).
void AppendByteLevel(absl::string_view bytes, std::string* out);

// Appends the bytes a token stands for, as the ByteLevel decoder computes them: if
// every code point of `token` is in the byte-level alphabet, the bytes they show;
// otherwise (added tokens such as "<｜begin▁of▁sentence｜>") the token's own UTF-8.
// REQUIRES: token is well-formed UTF-8.
void AppendTokenBytes(absl::string_view token, std::string* out);

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_BYTE_LEVEL_H_
