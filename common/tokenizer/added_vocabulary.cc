#include "common/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/tokenizer/utf8.h"

namespace moesh {

absl::StatusOr<AddedVocabulary> AddedVocabulary::FromJson(const JsonField& added_tokens,
                                                          const BpeModel& model,
                                                          const Normalizer& normalizer) {
  AddedVocabulary vocab;
  if (added_tokens.is_null()) return vocab;
  RETURN_IF_ERROR(added_tokens.ExpectArray());
  for (size_t i = 0; i < added_tokens.value().size(); ++i) {
    const JsonField entry = added_tokens.at(i);
    RETURN_IF_ERROR(entry.ExpectObject());
    AddedToken token;
    ASSIGN_OR_RETURN(int64_t id, entry["id"].Int());
    if (id < 0 || id > BpeModel::kMaxId) return entry["id"].Error("is out of range");
    token.id = static_cast<int32_t>(id);
    ASSIGN_OR_RETURN(token.content, entry["content"].String());
    if (token.content.empty() || !ValidateUtf8(token.content).ok()) {
      return entry["content"].Error("must be a non-empty UTF-8 string");
    }
    for (const char* flag : {"single_word", "lstrip", "rstrip"}) {
      ASSIGN_OR_RETURN(bool set, entry[flag].Bool(false));
      if (set) return entry[flag].Error("true is not supported");
    }
    ASSIGN_OR_RETURN(token.special, entry["special"].Bool(false));
    ASSIGN_OR_RETURN(token.normalized, entry["normalized"].Bool(!token.special));
    token.text = token.normalized ? normalizer.Normalize(token.content) : token.content;
    if (std::optional<int32_t> model_id = model.TokenToId(token.content)) {
      if (*model_id != token.id) {
        return entry["id"].Error(absl::StrCat("is ", token.id, " but model.vocab gives \"",
                                              token.content, "\" id ", *model_id));
      }
    } else if (model.IdToToken(token.id) != nullptr) {
      return entry["id"].Error(
          absl::StrCat(token.id, " is model.vocab's \"", *model.IdToToken(token.id), "\""));
    }
    if (vocab.by_id_.contains(token.id) || vocab.by_content_.contains(token.content)) {
      return entry.Error("repeats an earlier added token's id or content");
    }
    vocab.max_id_ = std::max(vocab.max_id_, token.id);
    vocab.by_id_[token.id] = vocab.tokens_.size();
    vocab.by_content_[token.content] = vocab.tokens_.size();
    vocab.tokens_.push_back(std::move(token));
  }
  for (size_t i = 0; i < vocab.tokens_.size(); ++i) {
    const AddedToken& t = vocab.tokens_[i];
    if (t.text.empty()) continue;
    vocab.by_first_byte_[t.normalized][static_cast<uint8_t>(t.text[0])].push_back(i);
  }
  for (auto& kind : vocab.by_first_byte_) {
    for (std::vector<size_t>& list : kind) {
      std::stable_sort(list.begin(), list.end(), [&](size_t a, size_t b) {
        return vocab.tokens_[a].text.size() > vocab.tokens_[b].text.size();
      });
    }
  }
  return vocab;
}

void AddedVocabulary::Split(absl::string_view text, bool normalized,
                            std::vector<TextSegment>* out) const {
  const auto& table = by_first_byte_[normalized];
  size_t plain_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const AddedToken* match = nullptr;
    for (size_t index : table[static_cast<uint8_t>(text[pos])]) {
      if (absl::string_view(text).substr(pos).substr(0, tokens_[index].text.size()) ==
          tokens_[index].text) {
        match = &tokens_[index];
        break;
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    if (pos > plain_start) out->push_back({text.substr(plain_start, pos - plain_start), -1});
    out->push_back({text.substr(pos, match->text.size()), match->id});
    pos += match->text.size();
    plain_start = pos;
  }
  if (text.size() > plain_start) out->push_back({text.substr(plain_start), -1});
}

const AddedToken* AddedVocabulary::FindById(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::FindByContent(absl::string_view content) const {
  auto it = by_content_.find(content);
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

}  // namespace moesh
