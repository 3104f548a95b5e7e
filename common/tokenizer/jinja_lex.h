// The lexer of jinja_parse.h: a template's source as jinja2's lexer reads
// it (its default delimiters; `-` and `+` whitespace control, trim_blocks,
// lstrip_blocks; newlines normalized to "\n" and the last one dropped
// unless kept; {% raw %} blocks as text).
#ifndef MOESH_COMMON_TOKENIZER_JINJA_LEX_H_
#define MOESH_COMMON_TOKENIZER_JINJA_LEX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moesh {
namespace jinja {

// How the source's whitespace reads (jinja2 Environment options; transformers sets
// trim_blocks and lstrip_blocks).
struct ParseOptions {
  bool trim_blocks = true;    // drop the newline after a block or comment tag
  bool lstrip_blocks = true;  // drop the spaces before a block or comment tag on its line
  bool keep_trailing_newline = false;
};

struct Token {
  enum class Type {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Type type;
  std::string value;
  int line;
  int64_t int_value = 0;
  double float_value = 0;
};

// The template's tokens, ending in kEof; INVALID_ARGUMENT with the line of
// what does not lex.
absl::StatusOr<std::vector<Token>> Lex(absl::string_view source, const ParseOptions& options);

// INVALID_ARGUMENT "chat template line LINE: WHAT".
absl::Status SyntaxError(int line, absl::string_view what);

}  // namespace jinja
}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_JINJA_LEX_H_
