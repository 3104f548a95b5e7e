// The model directory's tokenizer.json as a TextCodec; null when the
// directory has none (token-id-only serving). Errors for a corrupt file.
#ifndef MOESH_ROUTER_TEXT_CODEC_LOADER_H_
#define MOESH_ROUTER_TEXT_CODEC_LOADER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "router/text_codec.h"

namespace moesh {

absl::StatusOr<std::unique_ptr<TextCodec>> LoadTextCodec(const std::string& model_dir);

}  // namespace moesh

#endif  // MOESH_ROUTER_TEXT_CODEC_LOADER_H_
