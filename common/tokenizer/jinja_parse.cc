#include "common/tokenizer/jinja_parse.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <initializer_list>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/tokenizer/jinja_lex.h"
#include "common/tokenizer/utf8.h"

namespace moesh {
namespace jinja {
namespace {

bool NamesIn(const Expr& e, absl::string_view name) {
  if (e.kind == Expr::Kind::kName && e.name == name) return true;
  for (const ExprPtr& a : e.args) {
    if (a != nullptr && NamesIn(*a, name)) return true;
  }
  for (const auto& [k, v] : e.kwargs) {
    if (v != nullptr && NamesIn(*v, name)) return true;
  }
  return false;
}

// Whether `name` is read anywhere in `body` (macros' bodies included).
bool NamesIn(const Body& body, absl::string_view name) {
  for (const auto& s : body) {
    for (const ExprPtr* e : {&s->expr, &s->filter}) {
      if (*e != nullptr && NamesIn(**e, name)) return true;
    }
    for (const ExprPtr& e : s->conditions) {
      if (NamesIn(*e, name)) return true;
    }
    for (const ExprPtr& e : s->defaults) {
      if (e != nullptr && NamesIn(*e, name)) return true;
    }
    for (const Body& b : s->bodies) {
      if (NamesIn(b, name)) return true;
    }
  }
  return false;
}

// Tokens to the tree, jinja2's parser.
class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  absl::StatusOr<Body> Run() {
    Body body;
    std::string end;
    RETURN_IF_ERROR(ParseBody({}, &body, &end));
    return body;
  }

 private:
  const Token& Cur() const { return t_[i_]; }
  const Token& Peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool IsOp(absl::string_view op) const {
    return Cur().type == Token::Type::kOp && Cur().value == op;
  }
  bool IsName(absl::string_view n) const {
    return Cur().type == Token::Type::kName && Cur().value == n;
  }
  bool SkipOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    ++i_;
    return true;
  }
  bool SkipName(absl::string_view n) {
    if (!IsName(n)) return false;
    ++i_;
    return true;
  }
  absl::Status Unexpected() const {
    const Token& c = Cur();
    std::string what = c.value;
    if (c.type == Token::Type::kBlockEnd || c.type == Token::Type::kVarEnd) what = "end of tag";
    if (c.type == Token::Type::kEof) what = "end of template";
    return SyntaxError(c.line, absl::StrCat("unexpected '", what, "'"));
  }
  absl::Status ExpectOp(absl::string_view op) {
    return SkipOp(op) ? absl::OkStatus() : Unexpected();
  }
  absl::Status ExpectBlockEnd() {
    if (Cur().type != Token::Type::kBlockEnd) return Unexpected();
    ++i_;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Cur().type != Token::Type::kName) return Unexpected();
    return t_[i_++].value;
  }

  // Statements until a block tag named in `ends` (its name in *end, the tag's
  // name consumed) or the end of the template (only when `ends` is empty).
  absl::Status ParseBody(const std::vector<absl::string_view>& ends, Body* body, std::string* end) {
    if (++depth_ > 200) return SyntaxError(Cur().line, "blocks nested too deep");
    while (true) {
      const Token& c = Cur();
      if (c.type == Token::Type::kEof) {
        if (ends.empty()) break;
        return SyntaxError(c.line, absl::StrCat("missing '{% ", ends.back(), " %}'"));
      }
      if (c.type == Token::Type::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = c.line;
        s->text = c.value;
        body->push_back(std::move(s));
        ++i_;
        continue;
      }
      if (c.type == Token::Type::kVarBegin) {
        ++i_;
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kPrint;
        s->line = c.line;
        ASSIGN_OR_RETURN(s->expr, ParseTuple(true));
        if (Cur().type != Token::Type::kVarEnd) return Unexpected();
        ++i_;
        body->push_back(std::move(s));
        continue;
      }
      if (c.type != Token::Type::kBlockBegin) return Unexpected();
      ++i_;
      if (Cur().type != Token::Type::kName) return Unexpected();
      const std::string name = Cur().value;
      for (absl::string_view e : ends) {
        if (name == e) {
          ++i_;
          *end = name;
          --depth_;
          return absl::OkStatus();
        }
      }
      ++i_;
      ASSIGN_OR_RETURN(std::unique_ptr<Stmt> s, ParseStatement(name, c.line));
      body->push_back(std::move(s));
    }
    --depth_;
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseStatement(const std::string& name, int line) {
    auto s = std::make_unique<Stmt>();
    s->line = line;
    std::string end;
    if (name == "if") {
      s->kind = Stmt::Kind::kIf;
      while (true) {
        ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(false));
        s->conditions.push_back(std::move(cond));
        RETURN_IF_ERROR(ExpectBlockEnd());
        s->bodies.emplace_back();
        RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &s->bodies.back(), &end));
        if (end == "elif") continue;
        if (end == "else") {
          RETURN_IF_ERROR(ExpectBlockEnd());
          s->bodies.emplace_back();
          RETURN_IF_ERROR(ParseBody({"endif"}, &s->bodies.back(), &end));
        }
        break;
      }
    } else if (name == "for") {
      s->kind = Stmt::Kind::kFor;
      do {
        ASSIGN_OR_RETURN(std::string target, ExpectName());
        s->targets.push_back(target);
      } while (SkipOp(","));
      if (!SkipName("in")) return Unexpected();
      ASSIGN_OR_RETURN(s->expr, ParseTuple(false));
      if (SkipName("if")) {
        ASSIGN_OR_RETURN(s->filter, ParseExpression(true));
      }
      if (IsName("recursive")) return SyntaxError(line, "recursive loops are not supported");
      RETURN_IF_ERROR(ExpectBlockEnd());
      s->bodies.emplace_back();
      RETURN_IF_ERROR(ParseBody({"else", "endfor"}, &s->bodies.back(), &end));
      if (end == "else") {
        RETURN_IF_ERROR(ExpectBlockEnd());
        s->bodies.emplace_back();
        RETURN_IF_ERROR(ParseBody({"endfor"}, &s->bodies.back(), &end));
      }
      // The loop variable is made only for loops that read it.
      s->uses_loop = NamesIn(s->bodies[0], "loop") || (s->filter && NamesIn(*s->filter, "loop"));
    } else if (name == "set") {
      ASSIGN_OR_RETURN(std::string target, ExpectName());
      s->targets.push_back(target);
      if (SkipOp(".")) {
        s->kind = Stmt::Kind::kSetAttr;
        ASSIGN_OR_RETURN(std::string attr, ExpectName());
        s->targets.push_back(attr);
      } else {
        s->kind = Stmt::Kind::kSet;
        while (SkipOp(",")) {
          ASSIGN_OR_RETURN(std::string more, ExpectName());
          s->targets.push_back(more);
        }
      }
      if (SkipOp("=")) {
        ASSIGN_OR_RETURN(s->expr, ParseTuple(true));
      } else if (s->kind == Stmt::Kind::kSet && s->targets.size() == 1) {
        s->kind = Stmt::Kind::kSetBlock;
        RETURN_IF_ERROR(ExpectBlockEnd());
        s->bodies.emplace_back();
        RETURN_IF_ERROR(ParseBody({"endset"}, &s->bodies.back(), &end));
      } else {
        return Unexpected();
      }
    } else if (name == "macro") {
      s->kind = Stmt::Kind::kMacro;
      ASSIGN_OR_RETURN(std::string macro_name, ExpectName());
      s->targets.push_back(macro_name);
      RETURN_IF_ERROR(ExpectOp("("));
      while (!SkipOp(")")) {
        if (!s->params.empty()) RETURN_IF_ERROR(ExpectOp(","));
        if (SkipOp(")")) break;
        ASSIGN_OR_RETURN(std::string param, ExpectName());
        s->params.push_back(param);
        ExprPtr def;
        if (SkipOp("=")) {
          ASSIGN_OR_RETURN(def, ParseExpression(true));
        }
        s->defaults.push_back(std::move(def));
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      s->bodies.emplace_back();
      RETURN_IF_ERROR(ParseBody({"endmacro"}, &s->bodies.back(), &end));
      if (Cur().type == Token::Type::kName) ++i_;  // {% endmacro name %}
    } else if (name == "break" || name == "continue") {
      s->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
    } else if (name == "generation") {
      s->kind = Stmt::Kind::kBlock;
      RETURN_IF_ERROR(ExpectBlockEnd());
      s->bodies.emplace_back();
      RETURN_IF_ERROR(ParseBody({"endgeneration"}, &s->bodies.back(), &end));
    } else {
      return SyntaxError(line, absl::StrCat("unsupported tag '", name, "'"));
    }
    RETURN_IF_ERROR(ExpectBlockEnd());
    return s;
  }

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // An expression, or several separated by commas (a tuple, as a list).
  absl::StatusOr<ExprPtr> ParseTuple(bool with_condexpr) {
    const int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(with_condexpr));
    if (!IsOp(",")) return first;
    ExprPtr list = Make(Expr::Kind::kList, line);
    list->name = "tuple";
    list->args.push_back(std::move(first));
    while (SkipOp(",")) {
      if (Cur().type == Token::Type::kBlockEnd || Cur().type == Token::Type::kVarEnd) break;
      ASSIGN_OR_RETURN(ExprPtr next, ParseExpression(with_condexpr));
      list->args.push_back(std::move(next));
    }
    return list;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    if (++depth_ > 200) return SyntaxError(Cur().line, "expression nested too deep");
    ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    while (with_condexpr && IsName("if")) {
      ExprPtr c = Make(Expr::Kind::kCond, Cur().line);
      ++i_;
      ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      ExprPtr otherwise;
      if (SkipName("else")) {
        ASSIGN_OR_RETURN(otherwise, ParseExpression(true));
      }
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(otherwise));
      e = std::move(c);
    }
    --depth_;
    return e;
  }

  ExprPtr Binary(Expr::Kind kind, std::string op, ExprPtr l, ExprPtr r, int line) {
    ExprPtr e = Make(kind, line);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  // A left-associative run of next()'s expressions joined by any of `ops`
  // (operator tokens; for kAnd and kOr the names `and` and `or`).
  template <typename Next>
  absl::StatusOr<ExprPtr> Chain(std::initializer_list<absl::string_view> ops, Expr::Kind kind,
                                Next next) {
    const Token::Type type = kind == Expr::Kind::kBinary ? Token::Type::kOp : Token::Type::kName;
    ASSIGN_OR_RETURN(ExprPtr e, next());
    while (Cur().type == type && std::find(ops.begin(), ops.end(), Cur().value) != ops.end()) {
      const std::string op = Cur().value;
      const int line = Cur().line;
      ++i_;
      ASSIGN_OR_RETURN(ExprPtr r, next());
      e = Binary(kind, op, std::move(e), std::move(r), line);
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    return Chain({"or"}, Expr::Kind::kOr, [this] { return ParseAnd(); });
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    return Chain({"and"}, Expr::Kind::kAnd, [this] { return ParseNot(); });
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      ExprPtr e = Make(Expr::Kind::kNot, Cur().line);
      ++i_;
      ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      e->args.push_back(std::move(operand));
      return e;
    }
    return ParseCompare();
  }

  // Consumes a comparison operator (== != < <= > >= in, `not in` as "notin").
  bool TakeComparison(std::string* op) {
    if (Cur().type == Token::Type::kOp &&
        (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp("<=") || IsOp(">") || IsOp(">="))) {
      *op = t_[i_++].value;
    } else if (IsName("in")) {
      *op = "in";
      ++i_;
    } else if (IsName("not") && Peek().type == Token::Type::kName && Peek().value == "in") {
      *op = "notin";
      i_ += 2;
    } else {
      return false;
    }
    return true;
  }

  // One comparison at most: Python's chains (a < b < c) are refused.
  absl::StatusOr<ExprPtr> ParseCompare() {
    ASSIGN_OR_RETURN(ExprPtr e, ParseMath1());
    const int line = Cur().line;
    std::string op;
    if (!TakeComparison(&op)) return e;
    ASSIGN_OR_RETURN(ExprPtr r, ParseMath1());
    if (TakeComparison(&op)) return SyntaxError(line, "chained comparisons are not supported");
    return Binary(Expr::Kind::kBinary, op, std::move(e), std::move(r), line);
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    return Chain({"+", "-"}, Expr::Kind::kBinary, [this] { return ParseConcat(); });
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    return Chain({"~"}, Expr::Kind::kBinary, [this] { return ParseMath2(); });
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    return Chain({"*", "/", "//", "%"}, Expr::Kind::kBinary, [this] { return ParsePow(); });
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    return Chain({"**"}, Expr::Kind::kBinary, [this] { return ParseUnary(true); });
  }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    if (++depth_ > 200) return SyntaxError(Cur().line, "expression nested too deep");
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = Make(IsOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPos, Cur().line);
      ++i_;
      ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      e->args.push_back(std::move(operand));
    } else {
      ASSIGN_OR_RETURN(e, ParsePrimary());
    }
    ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    if (with_filter) {
      ASSIGN_OR_RETURN(e, ParseFilters(std::move(e)));
    }
    --depth_;
    return e;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token& c = Cur();
    ExprPtr e = Make(Expr::Kind::kLiteral, c.line);
    switch (c.type) {
      case Token::Type::kName:
        ++i_;
        if (c.value == "true" || c.value == "True") {
          e->literal = Value::Bool(true);
        } else if (c.value == "false" || c.value == "False") {
          e->literal = Value::Bool(false);
        } else if (c.value == "none" || c.value == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = c.value;
        }
        return e;
      case Token::Type::kString: {
        std::string s;
        while (Cur().type == Token::Type::kString) s += t_[i_++].value;  // adjacent literals join
        e->literal = Value::String(std::move(s));
        return e;
      }
      case Token::Type::kInt:
        e->literal = Value::Int(c.int_value);
        ++i_;
        return e;
      case Token::Type::kFloat:
        e->literal = Value::Float(c.float_value);
        ++i_;
        return e;
      case Token::Type::kOp:
        if (c.value == "(") {
          ++i_;
          if (SkipOp(")")) {
            e->kind = Expr::Kind::kList;
            e->name = "tuple";
            return e;
          }
          ASSIGN_OR_RETURN(ExprPtr inner, ParseTuple(true));
          RETURN_IF_ERROR(ExpectOp(")"));
          return inner;
        }
        if (c.value == "[") {
          ++i_;
          e->kind = Expr::Kind::kList;
          while (!SkipOp("]")) {
            if (!e->args.empty()) RETURN_IF_ERROR(ExpectOp(","));
            if (SkipOp("]")) break;
            ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
            e->args.push_back(std::move(item));
          }
          return e;
        }
        if (c.value == "{") {
          ++i_;
          e->kind = Expr::Kind::kDict;
          while (!SkipOp("}")) {
            if (!e->args.empty()) RETURN_IF_ERROR(ExpectOp(","));
            if (SkipOp("}")) break;
            ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
            RETURN_IF_ERROR(ExpectOp(":"));
            ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
            e->args.push_back(std::move(key));
            e->args.push_back(std::move(value));
          }
          return e;
        }
        break;
      default:
        break;
    }
    return Unexpected();
  }

  absl::Status ParseCallArgs(Expr* call) {
    RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!SkipOp(")")) {
      if (!first) RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      if (SkipOp(")")) break;
      if (IsOp("*") || IsOp("**"))
        return SyntaxError(Cur().line, "*args and **kwargs are not supported");
      if (Cur().type == Token::Type::kName && Peek().type == Token::Type::kOp &&
          Peek().value == "=") {
        const std::string key = Cur().value;
        i_ += 2;
        ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        call->kwargs.emplace_back(key, std::move(v));
      } else {
        if (!call->kwargs.empty())
          return SyntaxError(Cur().line, "positional argument after keyword argument");
        ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        call->args.push_back(std::move(v));
      }
    }
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    while (true) {
      const int line = Cur().line;
      if (SkipOp(".")) {
        if (Cur().type == Token::Type::kInt) {
          ExprPtr item = Make(Expr::Kind::kItem, line);
          ExprPtr index = Make(Expr::Kind::kLiteral, line);
          index->literal = Value::Int(t_[i_++].int_value);
          item->args.push_back(std::move(e));
          item->args.push_back(std::move(index));
          e = std::move(item);
          continue;
        }
        ASSIGN_OR_RETURN(std::string attr, ExpectName());
        ExprPtr a = Make(Expr::Kind::kAttr, line);
        a->name = attr;
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (SkipOp("[")) {
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) {
            ASSIGN_OR_RETURN(parts[k], ParseExpression(true));
          }
          if (k < 2 && SkipOp(":")) {
            slice = true;
            continue;
          }
          break;
        }
        RETURN_IF_ERROR(ExpectOp("]"));
        ExprPtr s = Make(slice ? Expr::Kind::kSlice : Expr::Kind::kItem, line);
        s->args.push_back(std::move(e));
        if (!slice && parts[0] == nullptr) return SyntaxError(line, "empty subscript");
        s->args.push_back(std::move(parts[0]));
        if (slice) {
          s->args.push_back(std::move(parts[1]));
          s->args.push_back(std::move(parts[2]));
        }
        e = std::move(s);
      } else if (IsOp("(")) {
        ExprPtr call = Make(Expr::Kind::kCall, line);
        call->args.push_back(std::move(e));
        RETURN_IF_ERROR(ParseCallArgs(call.get()));
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilters(ExprPtr e) {
    while (true) {
      const int line = Cur().line;
      if (SkipOp("|")) {
        ExprPtr f = Make(Expr::Kind::kFilter, line);
        ASSIGN_OR_RETURN(f->name, ExpectName());
        f->args.push_back(std::move(e));
        if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(f.get()));
        e = std::move(f);
      } else if (SkipName("is")) {
        ExprPtr t = Make(Expr::Kind::kTest, line);
        t->negated = SkipName("not");
        ASSIGN_OR_RETURN(t->name, ExpectName());
        t->args.push_back(std::move(e));
        if (IsOp("(")) {
          RETURN_IF_ERROR(ParseCallArgs(t.get()));
        } else if ((Cur().type == Token::Type::kName || Cur().type == Token::Type::kString ||
                    Cur().type == Token::Type::kInt || Cur().type == Token::Type::kFloat ||
                    IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          if (IsName("is")) return SyntaxError(line, "tests cannot be chained with 'is'");
          ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(absl::string_view source, const ParseOptions& options) {
  ASSIGN_OR_RETURN(std::vector<Token> tokens, Lex(source, options));
  return Parser(std::move(tokens)).Run();
}

}  // namespace jinja
}  // namespace moesh
