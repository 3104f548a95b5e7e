#include "common/tokenizer/streaming_detokenizer.h"

#include "common/tokenizer/utf8.h"

namespace moesh {

std::string StreamingDetokenizer::Next(int32_t id) {
  tokenizer_->AppendTokenBytes(id, skip_special_tokens_, &pending_);
  std::string out;
  pending_.erase(0, AppendUtf8Lossy(pending_, /*final=*/false, &out));
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out;
  AppendUtf8Lossy(pending_, /*final=*/true, &out);
  pending_.clear();
  return out;
}

}  // namespace moesh
