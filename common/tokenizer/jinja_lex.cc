#include "common/tokenizer/jinja_lex.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/tokenizer/utf8.h"

namespace moesh {
namespace jinja {

absl::Status SyntaxError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\f' || c == '\v' || c == '\r';
}

int CountNewlines(absl::string_view s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

// Source to tokens, jinja2's lexer with its whitespace rules.
class Lexer {
 public:
  Lexer(std::string source, const ParseOptions& o) : src_(std::move(source)), o_(o) {}

  absl::StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t start = src_.find('{', pos_);
      while (start != std::string::npos && start + 1 < src_.size() && src_[start + 1] != '{' &&
             src_[start + 1] != '%' && src_[start + 1] != '#') {
        start = src_.find('{', start + 1);
      }
      if (start == std::string::npos || start + 1 >= src_.size()) {
        Emit(Token::Type::kText, src_.substr(pos_));
        pos_ = src_.size();
        break;
      }
      const char kind = src_[start + 1];
      size_t after = start + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];
      std::string text = src_.substr(pos_, start - pos_);
      if (sign == '-') {
        size_t end = text.size();
        while (end > 0 && IsSpace(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && o_.lstrip_blocks && kind != '{') {
        const size_t l_pos = text.rfind('\n') + 1;  // npos + 1 == 0: the text's start
        if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
          bool blank = true;
          for (size_t i = l_pos; i < text.size(); ++i) blank = blank && IsSpace(text[i]);
          if (blank) text.resize(l_pos);
        }
      }
      Emit(Token::Type::kText, text);
      line_ += CountNewlines(absl::string_view(src_).substr(pos_, start - pos_));
      pos_ = after;
      if (kind == '#') {
        const size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) return SyntaxError(line_, "missing end of comment tag");
        const bool strip = end > pos_ && src_[end - 1] == '-';
        const bool keep = end > pos_ && src_[end - 1] == '+';
        line_ += CountNewlines(absl::string_view(src_).substr(pos_, end - pos_));
        pos_ = end + 2;
        line_starting = TrimAfterTag(strip, keep);
        continue;
      }
      if (kind == '%' && TryRaw(&line_starting)) continue;
      RETURN_IF_ERROR(LexTag(kind == '{' ? "}}" : "%}"));
      if (kind == '{') {
        line_starting = pending_strip_ && TrimAfterTag(true, false);
      } else {
        line_starting = TrimAfterTag(pending_strip_, pending_keep_);
      }
    }
    Emit(Token::Type::kEof, "");
    return std::move(tokens_);
  }

 private:
  void Emit(Token::Type type, std::string value) {
    if (type == Token::Type::kText && value.empty()) return;
    tokens_.push_back(Token{type, std::move(value), line_});
  }

  // After a tag's end: `-` strips every whitespace, trim_blocks one newline
  // (not after `+`). Returns whether what was dropped ends a line.
  bool TrimAfterTag(bool strip, bool keep) {
    if (strip) {
      size_t p = pos_;
      while (p < src_.size() && IsSpace(src_[p])) ++p;
      const bool newline = p > pos_ && src_[p - 1] == '\n';
      line_ += CountNewlines(absl::string_view(src_).substr(pos_, p - pos_));
      pos_ = p;
      return newline;
    }
    if (!keep && o_.trim_blocks && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      ++line_;
      return true;
    }
    return false;
  }

  // {% raw %}...{% endraw %}: its text as it is.
  bool TryRaw(bool* line_starting) {
    size_t p = pos_;
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    bool strip = false;
    if (p < src_.size() && src_[p] == '-') strip = true, ++p;
    if (src_.compare(p, 2, "%}") != 0) return false;
    pos_ = p + 2;
    TrimAfterTag(strip, false);
    size_t search = pos_;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) return false;
      size_t q = open + 2;
      const bool end_strip = q < src_.size() && src_[q] == '-';
      if (end_strip || (q < src_.size() && src_[q] == '+')) ++q;
      while (q < src_.size() && IsSpace(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && IsSpace(src_[q])) ++q;
      const bool close_strip = q < src_.size() && src_[q] == '-';
      if (close_strip) ++q;
      if (src_.compare(q, 2, "%}") != 0) {
        search = open + 2;
        continue;
      }
      std::string text = src_.substr(pos_, open - pos_);
      if (end_strip) {
        while (!text.empty() && IsSpace(text.back())) text.pop_back();
      }
      line_ += CountNewlines(absl::string_view(src_).substr(pos_, q + 2 - pos_));
      Emit(Token::Type::kText, text);
      pos_ = q + 2;
      *line_starting = TrimAfterTag(close_strip, false);
      return true;
    }
  }

  // The tokens of a {{ }} or {% %} tag, up to its end `close` (outside brackets).
  absl::Status LexTag(absl::string_view close) {
    const bool var = close == "}}";
    Emit(var ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "");
    int depth = 0;
    pending_strip_ = pending_keep_ = false;
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) {
        line_ += src_[pos_] == '\n';
        ++pos_;
      }
      if (pos_ >= src_.size()) {
        return SyntaxError(line_, absl::StrCat("missing end of tag '", close, "'"));
      }
      if (depth == 0) {
        for (char sign : {'-', '+', '\0'}) {
          const std::string end =
              sign ? absl::StrCat(std::string(1, sign), close) : std::string(close);
          if (src_.compare(pos_, end.size(), end) == 0 && !(sign == '+' && var)) {
            pos_ += end.size();
            pending_strip_ = sign == '-';
            pending_keep_ = sign == '+';
            Emit(var ? Token::Type::kVarEnd : Token::Type::kBlockEnd, "");
            return absl::OkStatus();
          }
        }
      }
      const char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos_;
        while (e < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
          ++e;
        Emit(Token::Type::kName, src_.substr(pos_, e - pos_));
        pos_ = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        RETURN_IF_ERROR(LexNumber());
      } else if (c == '\'' || c == '"') {
        RETURN_IF_ERROR(LexString(c));
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                     "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                     "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        bool found = false;
        for (const char* op : kOps) {
          const size_t n = std::char_traits<char>::length(op);
          if (src_.compare(pos_, n, op) == 0) {
            Emit(Token::Type::kOp, op);
            pos_ += n;
            found = true;
            if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++depth;
            if (op[0] == ')' || op[0] == ']' || op[0] == '}') --depth;
            break;
          }
        }
        if (!found)
          return SyntaxError(line_, absl::StrCat("unexpected character '", std::string(1, c), "'"));
      }
    }
  }

  absl::Status LexNumber() {
    size_t e = pos_;
    auto digits = [&] {
      while (e < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
        ++e;
    };
    digits();
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
        is_float = true;
        e = x;
        digits();
      }
    }
    std::string text;
    for (size_t i = pos_; i < e; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    Token t{is_float ? Token::Type::kFloat : Token::Type::kInt, text, line_};
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      errno = 0;
      t.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) return SyntaxError(line_, "integer literal out of range");
    }
    tokens_.push_back(std::move(t));
    pos_ = e;
    return absl::OkStatus();
  }

  // A quoted string with Python's escapes (as jinja2 reads them).
  absl::Status LexString(char quote) {
    std::string out;
    size_t p = pos_ + 1;
    const int start_line = line_;
    while (true) {
      if (p >= src_.size()) return SyntaxError(start_line, "unterminated string");
      const char c = src_[p];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\' || p + 1 >= src_.size()) {
        out += c;
        ++p;
        continue;
      }
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '0':
          out += '\0';
          break;
        case '\n':
          ++line_;
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (p + n > src_.size()) return SyntaxError(line_, "truncated \\x, \\u or \\U escape");
          char32_t cp = 0;
          for (size_t i = 0; i < n; ++i) {
            const char h = src_[p + i];
            if (!std::isxdigit(static_cast<unsigned char>(h))) {
              return SyntaxError(line_, "bad \\x, \\u or \\U escape");
            }
            cp = cp * 16 + (std::isdigit(static_cast<unsigned char>(h))
                                ? h - '0'
                                : (std::tolower(h) - 'a' + 10));
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
            return SyntaxError(line_, "escape outside Unicode scalar values");
          }
          AppendUtf8(cp, &out);
          p += n;
          break;
        }
        default:  // unknown escapes stay as written
          out += '\\';
          out += e;
      }
    }
    Emit(Token::Type::kString, out);
    tokens_.back().line = start_line;
    pos_ = p + 1;
    return absl::OkStatus();
  }

  const std::string src_;
  const ParseOptions o_;
  size_t pos_ = 0;
  int line_ = 1;
  bool pending_strip_ = false;
  bool pending_keep_ = false;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Lex(absl::string_view source, const ParseOptions& options) {
  // Newlines normalized to "\n"; the last one dropped unless kept.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!options.keep_trailing_newline && !src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src), options).Run();
}

}  // namespace jinja
}  // namespace moesh
