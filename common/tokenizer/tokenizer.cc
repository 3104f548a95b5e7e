#include "common/tokenizer/tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/json_field.h"
#include "common/tokenizer/utf8.h"
#include "nlohmann/json.hpp"

namespace moesh {

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& path_or_dir) {
  std::error_code ec;
  const std::string path = std::filesystem::is_directory(path_or_dir, ec)
                               ? JoinPath(path_or_dir, "tokenizer.json")
                               : path_or_dir;
  ASSIGN_OR_RETURN(std::string json, ReadFileToString(path));
  return FromJson(json, path);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(absl::string_view json,
                                                               const std::string& name) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(json.begin(), json.end());
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not valid JSON: ", e.what()));
  }
  const JsonField top(doc, name, "");
  RETURN_IF_ERROR(top.ExpectObject());
  for (const char* unsupported : {"truncation", "padding"}) {
    if (!top[unsupported].is_null())
      return top[unsupported].Error("is not supported (must be null)");
  }
  ASSIGN_OR_RETURN(std::string decoder, top["decoder"].Type());
  if (decoder != "ByteLevel") {
    return top["decoder"]["type"].Error(
        absl::StrCat("\"", decoder, "\" is not supported (ByteLevel)"));
  }
  ASSIGN_OR_RETURN(BpeModel model, BpeModel::FromJson(top["model"]));
  ASSIGN_OR_RETURN(Normalizer normalizer, Normalizer::FromJson(top["normalizer"]));
  ASSIGN_OR_RETURN(AddedVocabulary added,
                   AddedVocabulary::FromJson(top["added_tokens"], model, normalizer));
  ASSIGN_OR_RETURN(PreTokenizer pre_tokenizer, PreTokenizer::FromJson(top["pre_tokenizer"]));
  ASSIGN_OR_RETURN(PostProcessor post_processor, PostProcessor::FromJson(top["post_processor"]));
  std::unique_ptr<Tokenizer> tokenizer(
      new Tokenizer(std::move(model), std::move(added), std::move(normalizer),
                    std::move(pre_tokenizer), std::move(post_processor)));
  for (int32_t id : tokenizer->post_processor_.TemplateIds()) {
    if (!tokenizer->TokenText(id)) {
      return top["post_processor"].Error(absl::StrCat("adds id ", id, ", which no token has"));
    }
  }
  return tokenizer;
}

Tokenizer::Tokenizer(BpeModel model, AddedVocabulary added, Normalizer normalizer,
                     PreTokenizer pre_tokenizer, PostProcessor post_processor)
    : model_(std::move(model)),
      added_(std::move(added)),
      normalizer_(std::move(normalizer)),
      pre_tokenizer_(std::move(pre_tokenizer)),
      post_processor_(std::move(post_processor)),
      vocab_size_(std::max(model_.max_id(), added_.max_id()) + 1) {}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool add_special_tokens) const {
  RETURN_IF_ERROR(ValidateUtf8(text));
  std::vector<int32_t> ids;
  std::vector<TextSegment> raw, normalized_segments;
  added_.Split(text, /*normalized=*/false, &raw);
  for (const TextSegment& segment : raw) {
    if (segment.id >= 0) {
      ids.push_back(segment.id);
      continue;
    }
    // Normalization happens per segment, between the raw-matched added tokens.
    const std::string normalized =
        normalizer_.active() ? normalizer_.Normalize(segment.text) : std::string();
    normalized_segments.clear();
    added_.Split(normalizer_.active() ? absl::string_view(normalized) : segment.text,
                 /*normalized=*/true, &normalized_segments);
    for (const TextSegment& s : normalized_segments) {
      if (s.id >= 0) {
        ids.push_back(s.id);
      } else {
        EncodePlain(s.text, &ids);
      }
    }
  }
  if (add_special_tokens) ids = post_processor_.AddSpecialTokens(std::move(ids));
  return ids;
}

void Tokenizer::EncodePlain(absl::string_view text, std::vector<int32_t>* ids) const {
  std::vector<absl::string_view> pieces;
  pre_tokenizer_.Split(text, &pieces);
  std::string word;
  for (absl::string_view piece : pieces) {
    word.clear();
    AppendByteLevel(piece, &word);
    model_.Encode(word, ids);
  }
}

void Tokenizer::AppendTokenBytes(int32_t id, bool skip_special_tokens, std::string* out) const {
  if (const AddedToken* added = added_.FindById(id)) {
    if (!(skip_special_tokens && added->special)) ::moesh::AppendTokenBytes(added->text, out);
    return;
  }
  if (const std::string* token = model_.IdToToken(id)) ::moesh::AppendTokenBytes(*token, out);
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  std::string bytes;
  for (int32_t id : ids) AppendTokenBytes(id, skip_special_tokens, &bytes);
  return Utf8Lossy(bytes);
}

std::optional<int32_t> Tokenizer::TokenId(absl::string_view token) const {
  if (std::optional<int32_t> id = added_.FindByContent(token)) return id;
  return model_.TokenToId(token);
}

std::optional<std::string> Tokenizer::TokenText(int32_t id) const {
  if (const AddedToken* added = added_.FindById(id)) return added->text;
  if (const std::string* token = model_.IdToToken(id)) return *token;
  return std::nullopt;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  const AddedToken* added = added_.FindById(id);
  return added != nullptr && added->special;
}

}  // namespace moesh
