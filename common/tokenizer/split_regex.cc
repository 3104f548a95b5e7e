#include "common/tokenizer/split_regex.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/tokenizer/utf8.h"

namespace moesh {

// Recursive descent over the pattern's code points; see the grammar in the header.
class SplitRegexParser {
 public:
  explicit SplitRegexParser(absl::string_view pattern) : pattern_(pattern) {}

  absl::StatusOr<SplitRegex> Parse() {
    if (absl::Status s = ValidateUtf8(pattern_); !s.ok()) return Error(s.message());
    std::vector<size_t> offsets;
    DecodeUtf8(pattern_, &cps_, &offsets);
    SplitRegex re;
    re.pattern_ = std::string(pattern_);
    re.alternatives_.emplace_back();
    while (!AtEnd()) {
      if (Peek() == '|') {
        ++pos_;
        re.alternatives_.emplace_back();
        continue;
      }
      SplitRegex::Item item;
      if (Peek() == '(') {
        if (Peek(1) != '?' || Peek(2) != '!')
          return Error("groups other than (?!x) are not supported");
        pos_ += 3;
        ASSIGN_OR_RETURN(item.cls, ParseAtom());
        if (Peek() != ')')
          return Error("a look-ahead (?!x) must hold exactly one character or class");
        ++pos_;
        item.negative_lookahead = true;
        item.min = item.max = 0;
      } else {
        ASSIGN_OR_RETURN(item.cls, ParseAtom());
        RETURN_IF_ERROR(ParseQuantifier(&item));
      }
      re.alternatives_.back().push_back(std::move(item));
    }
    for (const SplitRegex::Alternative& alt : re.alternatives_) {
      const bool consumes = std::any_of(alt.begin(), alt.end(), [](const SplitRegex::Item& i) {
        return !i.negative_lookahead && i.min > 0;
      });
      if (!consumes) return Error("an alternative can match the empty string");
    }
    return re;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("unsupported Split regex \"", pattern_,
                                                   "\" (at code point ", pos_, "): ", what));
  }
  bool AtEnd() const { return pos_ >= cps_.size(); }
  // The code point `ahead` places on, or 0 past the end (never compared against 0).
  char32_t Peek(size_t ahead = 0) const {
    return pos_ + ahead < cps_.size() ? cps_[pos_ + ahead] : 0;
  }

  absl::StatusOr<CharClass> ParseAtom() {
    if (AtEnd()) return Error("expected a character or class");
    const char32_t c = Peek();
    if (c == '[') return ParseBracket();
    if (c == '\\') return ParseEscape(/*literal=*/nullptr);
    if (c < 0x80 &&
        absl::string_view(".^$()*+?{}[]|").find(static_cast<char>(c)) != absl::string_view::npos) {
      return Error(
          absl::StrCat("'", std::string(1, static_cast<char>(c)), "' here is not supported"));
    }
    ++pos_;
    return CharClass::Single(c);
  }

  // At a backslash. *literal (if not null) receives the character when the escape
  // stands for exactly one (\n, \-, ...), else nullopt.
  absl::StatusOr<CharClass> ParseEscape(std::optional<char32_t>* literal) {
    ++pos_;
    if (AtEnd()) return Error("trailing backslash");
    const char32_t c = cps_[pos_++];
    if (literal) *literal = std::nullopt;
    if (c == 'p' || c == 'P') {
      if (Peek() != '{') return Error("expected \\p{Name}");
      std::string name;
      for (++pos_; !AtEnd() && Peek() != '}'; ++pos_) AppendUtf8(Peek(), &name);
      if (AtEnd()) return Error("unterminated \\p{");
      ++pos_;
      std::optional<uint32_t> mask = CharClass::CategoryMask(name);
      if (!mask) return Error(absl::StrCat("\\p{", name, "} is not a general category"));
      return CharClass::Category(*mask, c == 'P');
    }
    if (c == 's' || c == 'S') return CharClass::Whitespace(c == 'S');
    char32_t ch;
    switch (c) {
      case 'r':
        ch = '\r';
        break;
      case 'n':
        ch = '\n';
        break;
      case 't':
        ch = '\t';
        break;
      case 'f':
        ch = '\f';
        break;
      case 'v':
        ch = '\v';
        break;
      default:
        if (c >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
            (c >= 'A' && c <= 'Z')) {
          std::string esc;
          AppendUtf8(c, &esc);
          return Error(absl::StrCat("escape \\", esc, " is not supported"));
        }
        ch = c;  // an escaped ASCII punctuation character or space
    }
    if (literal) *literal = ch;
    return CharClass::Single(ch);
  }

  // One endpoint of a class item: a literal or a one-character escape.
  absl::StatusOr<std::optional<char32_t>> ParseClassChar(CharClass* cls) {
    if (Peek() == '\\') {
      std::optional<char32_t> ch;
      ASSIGN_OR_RETURN(*cls, ParseEscape(&ch));
      return ch;
    }
    if (Peek() == '[') return Error("nested classes are not supported");
    if (Peek() == '&' && Peek(1) == '&') return Error("class intersection is not supported");
    return std::optional<char32_t>(cps_[pos_++]);
  }

  absl::StatusOr<CharClass> ParseBracket() {
    ++pos_;
    CharClass cls;
    const bool negated = Peek() == '^';
    if (negated) ++pos_;
    if (Peek() == ']') return Error("empty class, or ']' first in a class");
    while (true) {
      if (AtEnd()) return Error("unterminated [");
      if (Peek() == ']') {
        ++pos_;
        break;
      }
      CharClass item;
      ASSIGN_OR_RETURN(std::optional<char32_t> lo, ParseClassChar(&item));
      if (Peek() == '-' && pos_ + 1 < cps_.size() && Peek(1) != ']') {
        ++pos_;
        CharClass unused;
        ASSIGN_OR_RETURN(std::optional<char32_t> hi, ParseClassChar(&unused));
        if (!lo || !hi) return Error("a range's ends must be single characters");
        if (*hi < *lo) return Error("reversed range");
        cls.AddRange(*lo, *hi);
      } else if (lo) {
        cls.AddRange(*lo, *lo);
      } else {
        cls.AddClass(item);
      }
    }
    cls.set_negated(negated);
    return cls;
  }

  absl::StatusOr<int> ParseNumber() {
    int n = 0, digits = 0;
    for (; Peek() >= '0' && Peek() <= '9'; ++pos_, ++digits) {
      n = n * 10 + static_cast<int>(Peek() - '0');
      if (n > 1000) return Error("repeat count above 1000");
    }
    if (digits == 0) return Error("expected a number in {n,m}");
    return n;
  }

  absl::Status ParseQuantifier(SplitRegex::Item* item) {
    switch (Peek()) {
      case '?':
        item->min = 0, item->max = 1;
        break;
      case '*':
        item->min = 0, item->max = -1;
        break;
      case '+':
        item->min = 1, item->max = -1;
        break;
      case '{': {
        ++pos_;
        ASSIGN_OR_RETURN(item->min, ParseNumber());
        item->max = item->min;
        if (Peek() == ',') {
          ++pos_;
          item->max = -1;
          if (Peek() != '}') {
            ASSIGN_OR_RETURN(item->max, ParseNumber());
            if (item->max < item->min) return Error("{n,m} with m < n");
          }
        }
        if (Peek() != '}') return Error("expected '}'");
        break;
      }
      default:
        return absl::OkStatus();
    }
    ++pos_;
    if (Peek() == '?' || Peek() == '+') {
      return Error("lazy and possessive quantifiers are not supported");
    }
    return absl::OkStatus();
  }

  absl::string_view pattern_;
  std::vector<char32_t> cps_;
  size_t pos_ = 0;
};

absl::StatusOr<SplitRegex> SplitRegex::Compile(absl::string_view pattern) {
  return SplitRegexParser(pattern).Parse();
}

SplitRegex SplitRegex::Literal(absl::string_view literal) {
  SplitRegex re;
  re.pattern_ = std::string(literal);
  std::vector<char32_t> cps;
  std::vector<size_t> offsets;
  DecodeUtf8(literal, &cps, &offsets);
  re.alternatives_.emplace_back();
  for (char32_t c : cps) re.alternatives_.back().push_back(Item{CharClass::Single(c)});
  return re;
}

bool SplitRegex::MatchItems(const Alternative& alt, size_t index, absl::Span<const char32_t> text,
                            size_t pos, size_t* end) {
  if (index == alt.size()) {
    *end = pos;
    return true;
  }
  const Item& item = alt[index];
  if (item.negative_lookahead) {
    if (pos < text.size() && item.cls.Contains(text[pos])) return false;
    return MatchItems(alt, index + 1, text, pos, end);
  }
  const size_t left = text.size() - pos;
  const size_t limit = item.max < 0 ? left : std::min<size_t>(item.max, left);
  size_t n = 0;
  while (n < limit && item.cls.Contains(text[pos + n])) ++n;
  if (n < static_cast<size_t>(item.min)) return false;
  // Greedy: the longest run first, then give back one character at a time.
  for (size_t k = n;; --k) {
    if (MatchItems(alt, index + 1, text, pos + k, end)) return true;
    if (k == static_cast<size_t>(item.min)) return false;
  }
}

void SplitRegex::FindAll(absl::Span<const char32_t> text,
                         std::vector<std::pair<size_t, size_t>>* matches) const {
  size_t pos = 0;
  while (pos < text.size()) {
    bool found = false;
    for (size_t start = pos; start < text.size() && !found; ++start) {
      for (const Alternative& alt : alternatives_) {
        size_t end;
        if (MatchItems(alt, 0, text, start, &end)) {
          matches->emplace_back(start, end);
          pos = end;
          found = true;
          break;
        }
      }
    }
    if (!found) return;
  }
}

}  // namespace moesh
