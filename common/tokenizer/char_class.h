// A set of code points as Oniguruma's bracket expressions and escapes describe them
// (the regex engine Hugging Face tokenizers uses for Split patterns): ranges, general
// categories (\p{L}, \p{Nd}, ... from ICU's Unicode data) and \s / \S (Unicode
// White_Space, which is what Oniguruma's \s matches on UTF-8 text), optionally negated.
// Characters that ICU's (older) Unicode leaves unassigned but the tokenizers library
// already classifies come from unicode_overlay.inc, by major category only.
// Immutable after construction; thread-safe.
#ifndef MOESH_COMMON_TOKENIZER_CHAR_CLASS_H_
#define MOESH_COMMON_TOKENIZER_CHAR_CLASS_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace moesh {

class CharClass {
 public:
  // The general-category mask (ICU's U_GC_*_MASK bits) that \p{name} names: "L",
  // "Letter", "Lu", "N", "P", ...; nullopt if `name` is no general category (scripts
  // and other properties are not supported).
  static std::optional<uint32_t> CategoryMask(absl::string_view name);

  static CharClass Single(char32_t c);
  static CharClass Category(uint32_t mask, bool negated);  // \p{X} or \P{X}
  static CharClass Whitespace(bool negated);               // \s or \S

  void AddRange(char32_t lo, char32_t hi);  // REQUIRES: lo <= hi
  // Adds every member of `other` (a single escape or literal inside [...]).
  void AddClass(const CharClass& other);
  void set_negated(bool negated) { negated_ = negated; }

  bool Contains(char32_t c) const;

 private:
  std::vector<std::pair<char32_t, char32_t>> ranges_;  // [lo, hi], inclusive
  uint32_t categories_ = 0;                            // members: general category in this mask
  std::vector<uint32_t> not_categories_;               // members: general category outside a mask
  bool whitespace_ = false;                            // members: White_Space
  bool not_whitespace_ = false;                        // members: not White_Space
  bool negated_ = false;                               // the class is the complement of the above
};

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_CHAR_CLASS_H_
