#include "common/tokenizer/bpe_model.h"

#include <queue>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/tokenizer/utf8.h"

namespace moesh {
namespace {

absl::Status ExpectNullOrEmpty(const JsonField& f) {
  if (f.is_null() || (f.value().is_string() && f.value().get<std::string>().empty())) {
    return absl::OkStatus();
  }
  return f.Error("is not supported (must be null)");
}

// Splits one merges entry into its two tokens.
absl::StatusOr<std::pair<std::string, std::string>> MergePair(const JsonField& entry) {
  const nlohmann::json& v = entry.value();
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    const size_t space = s.find(' ');
    if (space == std::string::npos) return entry.Error("expected \"left right\"");
    return std::make_pair(s.substr(0, space), s.substr(space + 1));
  }
  if (v.is_array() && v.size() == 2 && v[0].is_string() && v[1].is_string()) {
    return std::make_pair(v[0].get<std::string>(), v[1].get<std::string>());
  }
  return entry.Error("expected \"left right\" or [\"left\", \"right\"]");
}

}  // namespace

absl::StatusOr<BpeModel> BpeModel::FromJson(const JsonField& model) {
  ASSIGN_OR_RETURN(std::string type, model.Type());
  if (type != "BPE")
    return model["type"].Error(absl::StrCat("\"", type, "\" is not supported (BPE)"));
  if (!model["dropout"].is_null()) return model["dropout"].Error("is not supported (must be null)");
  RETURN_IF_ERROR(ExpectNullOrEmpty(model["unk_token"]));
  RETURN_IF_ERROR(ExpectNullOrEmpty(model["continuing_subword_prefix"]));
  RETURN_IF_ERROR(ExpectNullOrEmpty(model["end_of_word_suffix"]));
  ASSIGN_OR_RETURN(bool byte_fallback, model["byte_fallback"].Bool(false));
  if (byte_fallback) return model["byte_fallback"].Error("is not supported (must be false)");

  BpeModel bpe;
  ASSIGN_OR_RETURN(bpe.ignore_merges_, model["ignore_merges"].Bool(false));
  const JsonField vocab = model["vocab"];
  RETURN_IF_ERROR(vocab.ExpectObject());
  for (auto it = vocab.value().begin(); it != vocab.value().end(); ++it) {
    const JsonField entry = vocab[it.key()];
    ASSIGN_OR_RETURN(int64_t id, entry.Int());
    if (id < 0 || id > kMaxId) return entry.Error(absl::StrCat("id ", id, " is out of range"));
    if (!ValidateUtf8(it.key()).ok()) return entry.Error("token is not valid UTF-8");
    if (static_cast<size_t>(id) >= bpe.tokens_.size()) {
      bpe.tokens_.resize(id + 1);
      bpe.has_token_.resize(id + 1, false);
    }
    if (bpe.has_token_[id]) return entry.Error(absl::StrCat("id ", id, " is used twice"));
    bpe.has_token_[id] = true;
    bpe.tokens_[id] = it.key();
    bpe.vocab_.emplace(it.key(), static_cast<int32_t>(id));
  }

  const JsonField merges = model["merges"];
  if (!merges.is_null()) RETURN_IF_ERROR(merges.ExpectArray());
  const size_t num_merges = merges.is_null() ? 0 : merges.value().size();
  for (size_t i = 0; i < num_merges; ++i) {
    const JsonField entry = merges.at(i);
    ASSIGN_OR_RETURN(auto pair, MergePair(entry));
    const std::string merged = pair.first + pair.second;
    const std::string* const parts[] = {&pair.first, &pair.second, &merged};
    for (const std::string* token : parts) {
      if (!bpe.vocab_.contains(*token)) {
        return entry.Error(absl::StrCat("token \"", *token, "\" is not in model.vocab"));
      }
    }
    // A repeated pair keeps its last rank, as tokenizers' HashMap collect does.
    bpe.merges_[PairKey(bpe.vocab_[pair.first], bpe.vocab_[pair.second])] = {
        static_cast<int32_t>(i), bpe.vocab_[merged]};
  }
  return bpe;
}

std::optional<int32_t> BpeModel::TokenToId(absl::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size() || !has_token_[id]) return nullptr;
  return &tokens_[id];
}

void BpeModel::Encode(absl::string_view word, std::vector<int32_t>* ids) const {
  if (ignore_merges_) {
    if (std::optional<int32_t> id = TokenToId(word)) {
      ids->push_back(*id);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int prev;  // index of the live neighbour, -1 at the ends
    int next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  for (size_t pos = 0; pos < word.size();) {
    const size_t len = DecodeUtf8At(word, pos).length;
    auto it = vocab_.find(word.substr(pos, len));
    pos += len;
    if (it == vocab_.end()) continue;
    const int index = static_cast<int>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back({it->second, index - 1, -1, true});
  }

  struct Merge {
    int32_t rank;
    int pos;
    int32_t new_id;
    // std::priority_queue pops the largest: make that the lowest rank, then leftmost.
    bool operator<(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Merge> queue;
  auto push_pair = [&](int left) {
    const int right = symbols[left].next;
    if (right < 0) return;
    auto it = merges_.find(PairKey(symbols[left].id, symbols[right].id));
    if (it != merges_.end()) queue.push({it->second.first, left, it->second.second});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) push_pair(i);

  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    // Skip entries made stale by earlier merges around this position.
    auto it = merges_.find(PairKey(left.id, symbols[left.next].id));
    if (it == merges_.end() || it->second.second != top.new_id) continue;
    Symbol& right = symbols[left.next];
    left.id = top.new_id;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) push_pair(left.prev);
    push_pair(top.pos);
  }
  for (const Symbol& s : symbols) {
    if (s.alive) ids->push_back(s.id);
  }
}

}  // namespace moesh
