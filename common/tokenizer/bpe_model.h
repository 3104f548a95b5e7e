// The BPE model of a Hugging Face tokenizer.json ("model": {"type": "BPE", ...}) for
// byte-level tokenizers: vocabulary, ranked merges, and the merge loop of
// tokenizers' `Word::merge_all` (lowest rank first, leftmost on ties), so ids match
// the library's exactly. Immutable after FromJson; thread-safe.
#ifndef MOESH_COMMON_TOKENIZER_BPE_MODEL_H_
#define MOESH_COMMON_TOKENIZER_BPE_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/json_field.h"

namespace moesh {

class BpeModel {
 public:
  // Ids must lie in [0, kMaxId].
  static constexpr int32_t kMaxId = (1 << 24) - 1;

  // Reads the "model" object. Supported: vocab (token -> id), merges as "a b" strings or
  // ["a", "b"] pairs (a, b and ab all in the vocabulary), ignore_merges; dropout, unk_token,
  // continuing_subword_prefix and end_of_word_suffix must be null and byte_fallback false.
  // INVALID_ARGUMENT naming the file and field otherwise.
  static absl::StatusOr<BpeModel> FromJson(const JsonField& model);

  // Appends the ids of one pre-token, given in byte-level form. Characters outside the
  // vocabulary are dropped, as tokenizers does for a BPE model without unk_token.
  void Encode(absl::string_view word, std::vector<int32_t>* ids) const;

  std::optional<int32_t> TokenToId(absl::string_view token) const;
  // nullptr if no vocabulary token has that id.
  const std::string* IdToToken(int32_t id) const;
  // The largest id in the vocabulary, or -1 if it is empty.
  int32_t max_id() const { return static_cast<int32_t>(tokens_.size()) - 1; }

 private:
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  absl::flat_hash_map<std::string, int32_t> vocab_;
  std::vector<std::string> tokens_;  // by id
  std::vector<bool> has_token_;      // by id: false for holes in the id range
  // (left id, right id) -> (rank, merged id)
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  bool ignore_merges_ = false;
};

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_BPE_MODEL_H_
