#include "router/text_codec_loader.h"

#include "base/file_util.h"
#include "common/tokenizer/streaming_detokenizer.h"
#include "common/tokenizer/tokenizer.h"

namespace moesh {
namespace {

class TokenizerStream : public TextStream {
 public:
  explicit TokenizerStream(const Tokenizer* t) : detok_(t, /*skip_special_tokens=*/true) {}
  std::string Push(int32_t id) override { return detok_.Next(id); }
  std::string Flush() override { return detok_.Flush(); }

 private:
  StreamingDetokenizer detok_;
};

class TokenizerCodec : public TextCodec {
 public:
  explicit TokenizerCodec(std::unique_ptr<Tokenizer> t) : tokenizer_(std::move(t)) {}
  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const override {
    return tokenizer_->Encode(text, add_special_tokens);
  }
  std::string Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const override {
    return tokenizer_->Decode(ids, skip_special_tokens);
  }
  std::unique_ptr<TextStream> NewStream() const override {
    return std::make_unique<TokenizerStream>(tokenizer_.get());
  }

 private:
  const std::unique_ptr<Tokenizer> tokenizer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TextCodec>> LoadTextCodec(const std::string& model_dir) {
  if (!FileExists(JoinPath(model_dir, "tokenizer.json"))) return std::unique_ptr<TextCodec>();
  absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::Load(model_dir);
  if (!t.ok()) return t.status();
  return std::unique_ptr<TextCodec>(std::make_unique<TokenizerCodec>(std::move(*t)));
}

}  // namespace moesh
