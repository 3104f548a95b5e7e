// Incremental decoding for streaming generation: feed ids one at a time, get back
// the text they complete. Concatenating every Next() and the final Flush() gives
// exactly Tokenizer::Decode of all the ids, and every returned piece is well-formed
// UTF-8: bytes that may still become a character (e.g. the first two bytes of a
// three-byte character split over tokens) are held back until the next id decides.
//
// Not thread-safe (one per stream). REQUIRES: the tokenizer outlives it.
#ifndef MOESH_COMMON_TOKENIZER_STREAMING_DETOKENIZER_H_
#define MOESH_COMMON_TOKENIZER_STREAMING_DETOKENIZER_H_

#include <cstdint>
#include <string>

#include "common/tokenizer/tokenizer.h"

namespace moesh {

class StreamingDetokenizer {
 public:
  StreamingDetokenizer(const Tokenizer* tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // The text `id` completes (possibly empty). Ill-formed bytes become U+FFFD as soon as
  // they are known to be ill-formed.
  std::string Next(int32_t id);
  // The end of the stream: held-back bytes (an unfinished character) become one U+FFFD.
  // The detokenizer is then empty and may start a new stream.
  std::string Flush();
  // Bytes held back so far (0..3).
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* const tokenizer_;
  const bool skip_special_tokens_;
  std::string pending_;  // a valid prefix of one character, awaiting its other bytes
};

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_STREAMING_DETOKENIZER_H_
