// The regular expressions of Hugging Face `Split` pre-tokenizers, for the subset of
// Oniguruma syntax that byte-level BPE tokenizers (DeepSeek-V3's among them) use:
//
//   pattern := alt ('|' alt)*          leftmost alternative that matches wins (Perl order)
//   alt     := item*
//   item    := atom quant? | '(?!' atom ')'      negative look-ahead of one character
//   atom    := literal | escape | '[' '^'? (char | char '-' char | escape)+ ']'
//   escape  := \p{Cat} \P{Cat} (general categories) | \s \S | \r \n \t \f \v | \<punct>
//   quant   := ? * + {n} {n,} {n,m}    greedy, backtracking
//
// Anything else (groups, anchors, '.', \d, \w, lazy or possessive quantifiers, nested
// classes, scripts in \p{...}) is refused with INVALID_ARGUMENT naming the pattern, so a
// tokenizer.json that needs more is never tokenized wrongly. Patterns that could match
// the empty string are refused too. Matching runs over code points; a look-ahead at
// the end of the searched span sees "no character" (as Oniguruma does at the end of
// the string, which is what a Split sees: one pre-token at a time).
// Immutable after Compile; thread-safe.
#ifndef MOESH_COMMON_TOKENIZER_SPLIT_REGEX_H_
#define MOESH_COMMON_TOKENIZER_SPLIT_REGEX_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/tokenizer/char_class.h"

namespace moesh {

class SplitRegex {
 public:
  // `pattern` is UTF-8 (the JSON string's value, escapes already decoded).
  static absl::StatusOr<SplitRegex> Compile(absl::string_view pattern);
  // A pattern that matches `literal` exactly (a Split with {"String": ...}).
  // REQUIRES: literal is non-empty, well-formed UTF-8.
  static SplitRegex Literal(absl::string_view literal);

  // Appends the successive non-overlapping matches in `text`, leftmost first, as
  // [begin, end) indices into `text`; every match is non-empty.
  void FindAll(absl::Span<const char32_t> text,
               std::vector<std::pair<size_t, size_t>>* matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Item {
    CharClass cls;
    int min = 1;
    int max = 1;                      // -1: unbounded
    bool negative_lookahead = false;  // zero-width: the next character is not in cls
  };
  using Alternative = std::vector<Item>;

  // True and *end set iff `alt` matches text[pos, *end) starting at item `index`.
  static bool MatchItems(const Alternative& alt, size_t index, absl::Span<const char32_t> text,
                         size_t pos, size_t* end);

  std::string pattern_;
  std::vector<Alternative> alternatives_;

  friend class SplitRegexParser;
};

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_SPLIT_REGEX_H_
