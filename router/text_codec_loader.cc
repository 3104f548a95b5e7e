#include "router/text_codec_loader.h"

#include "common/file_util.h"

namespace moesh {

absl::StatusOr<std::unique_ptr<TextCodec>> LoadTextCodec(const std::string& model_dir) {
  if (!FileExists(JoinPath(model_dir, "tokenizer.json"))) return std::unique_ptr<TextCodec>();
  // TODO(tokenizer): wrap common/tokenizer once it lands.
  return std::unique_ptr<TextCodec>();
}

}  // namespace moesh
