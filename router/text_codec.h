// What the router needs from a tokenizer: encode prompts, stream text deltas,
// decode whole sequences. Implemented over common/tokenizer.
#ifndef MOESH_ROUTER_TEXT_CODEC_H_
#define MOESH_ROUTER_TEXT_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace moesh {

// Turns a stream of ids into text deltas that are always whole UTF-8.
class TextStream {
 public:
  virtual ~TextStream() = default;
  virtual std::string Push(int32_t id) = 0;
  virtual std::string Flush() = 0;
};

class TextCodec {
 public:
  virtual ~TextCodec() = default;
  // INVALID_ARGUMENT for malformed UTF-8.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                                      bool add_special_tokens) const = 0;
  virtual std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const = 0;
  virtual std::unique_ptr<TextStream> NewStream() const = 0;
};

}  // namespace moesh

#endif  // MOESH_ROUTER_TEXT_CODEC_H_
