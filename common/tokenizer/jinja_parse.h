// A Jinja template's syntax tree, and the parser that builds it from the
// source as jinja2's lexer and parser read it (its default delimiters; the
// whitespace control of `-` and `+`, trim_blocks and lstrip_blocks; one
// trailing newline dropped).
//
// Statements: if/elif/else, for (tuple targets, an `if` filter, else; break
// and continue), set (a name, names from a tuple, a namespace's attribute,
// or a block), macro, raw, and transformers' generation block (rendered as
// its body). Expressions: literals, lists, tuples (read as lists), dicts,
// names, attributes, subscripts and slices, calls with keyword arguments,
// filters, tests, `a if c else b`, and Python's operators with jinja2's
// precedence. Anything else is INVALID_ARGUMENT naming the line.
#ifndef MOESH_COMMON_TOKENIZER_JINJA_PARSE_H_
#define MOESH_COMMON_TOKENIZER_JINJA_PARSE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/jinja_lex.h"
#include "common/tokenizer/jinja_value.h"

namespace moesh {
namespace jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args: the items (name "tuple": a tuple)
    kDict,     // args: key, value, key, value, ...
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null: omitted)
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is [not] name(args[1..], kwargs); negated
    kNot,      // not args[0]
    kNeg,      // -args[0]
    kPos,      // +args[0]
    kBinary,   // args[0] name args[1]: + - * / // % ** ~ == != < <= > >= in notin
    kAnd,      // args[0] and args[1]
    kOr,       // args[0] or args[1]
    kCond,     // args[0] if args[1] else args[2] (args[2] null: undefined)
  };
  Kind kind = Kind::kLiteral;
  int line = 1;
  Value literal;
  std::string name;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kPrint,     // {{ expr }}
    kIf,        // if conditions[i]: bodies[i]; bodies[conditions.size()] (if present): else
    kFor,       // for targets in expr [if filter]: bodies[0]; else bodies[1] (if present)
    kSet,       // targets (one name, or several unpacked) = expr
    kSetAttr,   // targets[0].targets[1] = expr
    kSetBlock,  // targets[0] = the output of bodies[0]
    kMacro,     // macro targets[0](params = defaults): bodies[0]
    kBreak,
    kContinue,
    kBlock,  // bodies[0], as it is (transformers' {% generation %})
  };
  Kind kind = Kind::kText;
  int line = 1;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  std::vector<std::string> targets;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // per param; null: none
  bool uses_loop = false;         // kFor: its body or filter names `loop`
};

// The template's statements; INVALID_ARGUMENT with the line of a syntax
// error or an unsupported construct.
absl::StatusOr<Body> ParseTemplate(absl::string_view source, const ParseOptions& options);

}  // namespace jinja
}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_JINJA_PARSE_H_
