#include "common/tokenizer/jinja.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/tokenizer/jinja_builtins.h"

namespace moesh {
namespace jinja {
namespace {

// One rendering: the scopes, the output and the bounds.
class Renderer {
 public:
  Renderer(const ValueDict& context, const RenderLimits& limits) : limits_(limits) {
    scopes_.emplace_back(context);
  }

  // A failure names the line of the statement it stopped in (a bound's
  // RESOURCE_EXHAUSTED excepted: no one line is at fault).
  absl::Status Run(const Body& body, std::string* out) {
    const absl::StatusOr<Flow> flow = Exec(body, out);
    if (flow.ok() || flow.status().code() == absl::StatusCode::kResourceExhausted) {
      return flow.status();
    }
    return absl::Status(flow.status().code(),
                        absl::StrCat("chat template line ", line_, ": ", flow.status().message()));
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Scope = ValueDict;

  absl::Status Step(int64_t n = 1) {
    steps_ += n;
    if (steps_ > limits_.max_steps) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the chat template ran past ", limits_.max_steps, " steps"));
    }
    return absl::OkStatus();
  }

  absl::Status Append(const std::string& text, std::string* out) {
    if (out->size() + text.size() > limits_.max_output_bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the chat template's output passed ", limits_.max_output_bytes, " bytes"));
    }
    *out += text;
    return absl::OkStatus();
  }

  Value Lookup(const std::string& name) const {
    for (size_t i = scopes_.size(); i-- > base_;) {
      if (const Value* v = FindEntry(scopes_[i], name)) return *v;
    }
    if (base_ > 0) {
      if (const Value* v = FindEntry(scopes_[0], name)) return *v;
    }
    return Global(name);
  }

  void Assign(const std::string& name, Value v) { SetEntry(&scopes_.back(), name, std::move(v)); }

  absl::Status Unpack(const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      Assign(targets[0], v);
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(ValueList items, v.Items());
    if (items.size() != targets.size()) {
      return TypeError(absl::StrCat(items.size() < targets.size() ? "not enough" : "too many",
                                    " values to unpack (expected ", targets.size(), ", got ",
                                    items.size(), ")"));
    }
    for (size_t i = 0; i < targets.size(); ++i) Assign(targets[i], items[i]);
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> Exec(const Body& body, std::string* out) {
    for (const auto& s : body) {
      absl::StatusOr<Flow> flow = ExecOne(*s, out);
      if (!flow.ok()) return flow.status();
      if (*flow != Flow::kNormal) return *flow;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> ExecOne(const Stmt& s, std::string* out) {
    RETURN_IF_ERROR(Step());
    line_ = s.line;
    switch (s.kind) {
      case Stmt::Kind::kText:
        RETURN_IF_ERROR(Append(s.text, out));
        return Flow::kNormal;
      case Stmt::Kind::kPrint: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        RETURN_IF_ERROR(Append(v.Str(), out));
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          ASSIGN_OR_RETURN(Value c, Eval(*s.conditions[i]));
          if (c.Truthy()) return Exec(s.bodies[i], out);
        }
        if (s.bodies.size() > s.conditions.size()) return Exec(s.bodies.back(), out);
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        RETURN_IF_ERROR(ExecFor(s, out));
        return Flow::kNormal;
      case Stmt::Kind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        RETURN_IF_ERROR(Unpack(s.targets, v));
        return Flow::kNormal;
      }
      case Stmt::Kind::kSetAttr: {
        Value ns = Lookup(s.targets[0]);
        if (ns.kind() != Value::Kind::kNamespace) {
          return TypeError(
              absl::StrCat("cannot assign attribute on non-namespace object '", s.targets[0], "'"));
        }
        ASSIGN_OR_RETURN(Value v, Eval(*s.expr));
        ns.SetAttribute(s.targets[1], std::move(v));
        return Flow::kNormal;
      }
      case Stmt::Kind::kSetBlock: {
        std::string text;
        ASSIGN_OR_RETURN(Flow flow, Exec(s.bodies[0], &text));
        (void)flow;
        Assign(s.targets[0], Value::String(std::move(text)));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        Assign(s.targets[0], MakeMacro(s));
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kBlock:
        return Exec(s.bodies[0], out);
    }
    return Flow::kNormal;
  }

  // Each iteration has its own scope (jinja2: a `set` in the body lasts
  // until the iteration ends).
  absl::Status ExecFor(const Stmt& s, std::string* out) {
    ASSIGN_OR_RETURN(Value iterable, Eval(*s.expr));
    ASSIGN_OR_RETURN(ValueList items, iterable.Items());
    RETURN_IF_ERROR(Step(static_cast<int64_t>(items.size())));  // a loop costs its items too
    if (s.filter != nullptr) {
      ValueList kept;
      for (const Value& item : items) {
        ASSIGN_OR_RETURN(bool keep, InScope([&]() -> absl::StatusOr<bool> {
                           RETURN_IF_ERROR(Unpack(s.targets, item));
                           ASSIGN_OR_RETURN(Value k, Eval(*s.filter));
                           return k.Truthy();
                         }));
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      ASSIGN_OR_RETURN(Flow flow, InScope([&]() -> absl::StatusOr<Flow> {
                         RETURN_IF_ERROR(Unpack(s.targets, items[i]));
                         if (s.uses_loop) Assign("loop", LoopValue(items, i));
                         return Exec(s.bodies[0], out);
                       }));
      if (flow == Flow::kBreak) break;
    }
    if (n == 0 && s.bodies.size() > 1) {
      ASSIGN_OR_RETURN(Flow flow, Exec(s.bodies[1], out));
      (void)flow;
    }
    return absl::OkStatus();
  }

  // f() in a new innermost scope.
  template <typename F>
  auto InScope(F f) -> decltype(f()) {
    scopes_.emplace_back();
    auto r = f();
    scopes_.pop_back();
    return r;
  }

  static Value LoopValue(const ValueList& items, int64_t i) {
    const int64_t n = static_cast<int64_t>(items.size());
    ValueDict loop = {
        {"index", Value::Int(i + 1)},
        {"index0", Value::Int(i)},
        {"revindex", Value::Int(n - i)},
        {"revindex0", Value::Int(n - i - 1)},
        {"first", Value::Bool(i == 0)},
        {"last", Value::Bool(i == n - 1)},
        {"length", Value::Int(n)},
        {"depth", Value::Int(1)},
        {"depth0", Value::Int(0)},
        {"previtem", i > 0 ? items[i - 1] : Value()},
        {"nextitem", i + 1 < n ? items[i + 1] : Value()},
        {"cycle", Value::Callable("cycle",
                                  [i](CallArgs& a) -> absl::StatusOr<Value> {
                                    if (a.positional.empty())
                                      return TypeError("no items for cycling given");
                                    return a.positional[i % a.positional.size()];
                                  })},
    };
    return Value::Dict(std::move(loop));
  }

  Value MakeMacro(const Stmt& s) {
    const Stmt* macro = &s;
    return Value::Callable(s.targets[0], [this, macro](CallArgs& a) -> absl::StatusOr<Value> {
      return CallMacro(*macro, a);
    });
  }

  absl::StatusOr<Value> CallMacro(const Stmt& m, CallArgs& a) {
    if (depth_ >= limits_.max_call_depth) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the chat template's macros nest deeper than ", limits_.max_call_depth));
    }
    if (a.positional.size() > m.params.size()) {
      return TypeError(absl::StrCat("macro '", m.targets[0], "' takes not more than ",
                                    m.params.size(), " argument(s)"));
    }
    for (const auto& [k, v] : a.keyword) {
      if (std::find(m.params.begin(), m.params.end(), k) == m.params.end()) {
        return TypeError(
            absl::StrCat("macro '", m.targets[0], "' takes no keyword argument '", k, "'"));
      }
    }
    // The arguments given; the defaults of the rest, evaluated in the macro's scope.
    Scope scope;
    std::vector<size_t> defaulted;
    for (size_t i = 0; i < m.params.size(); ++i) {
      const Value* given = Arg(a, i, m.params[i]);
      scope.emplace_back(m.params[i], given != nullptr ? *given : Value());
      if (given == nullptr && m.defaults[i] != nullptr) defaulted.push_back(i);
    }
    const size_t saved_base = base_;
    const int saved_line = line_;  // the calling statement's, again once the call returns
    scopes_.push_back(std::move(scope));
    base_ = scopes_.size() - 1;
    ++depth_;
    std::string text;
    absl::Status st;
    for (size_t i : defaulted) {
      absl::StatusOr<Value> d = Eval(*m.defaults[i]);
      if (!d.ok()) {
        st = d.status();
        break;
      }
      Assign(m.params[i], *d);
    }
    if (st.ok()) st = Exec(m.bodies[0], &text).status();
    --depth_;
    base_ = saved_base;
    scopes_.pop_back();
    RETURN_IF_ERROR(st);
    line_ = saved_line;
    return Value::String(std::move(text));
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.args.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      ASSIGN_OR_RETURN(Value v, Eval(*x));
      args.keyword.emplace_back(k, std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    RETURN_IF_ERROR(Step());
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList: {
        ValueList items;
        for (const auto& x : e.args) {
          ASSIGN_OR_RETURN(Value v, Eval(*x));
          items.push_back(std::move(v));
        }
        return e.name == "tuple" ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
      }
      case Expr::Kind::kDict: {
        ValueDict items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
          ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
          if (!k.is_string()) return TypeError("dict keys must be strings in a chat template");
          SetEntry(&items, k.str(), std::move(v));
        }
        return Value::Dict(std::move(items));
      }
      case Expr::Kind::kAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        return GetAttr(obj, e.name);
      }
      case Expr::Kind::kItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return GetItem(obj, key);
      }
      case Expr::Kind::kSlice: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        Value parts[3];
        for (int k = 0; k < 3; ++k) {
          if (e.args[k + 1] != nullptr) {
            ASSIGN_OR_RETURN(parts[k], Eval(*e.args[k + 1]));
          }
        }
        return GetSlice(obj, parts[0], parts[1], parts[2]);
      }
      case Expr::Kind::kCall: {
        ASSIGN_OR_RETURN(Value callee, Eval(*e.args[0]));
        if (callee.kind() != Value::Kind::kFunction) {
          return TypeError(callee.is_undefined()
                               ? "call of an undefined value"
                               : absl::StrCat("'", callee.TypeName(), "' object is not callable"));
        }
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return callee.function()(args);
      }
      case Expr::Kind::kFilter: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        absl::StatusOr<Value> r = ApplyFilter(e.name, v, args);
        if (absl::IsNotFound(r.status())) return absl::InvalidArgumentError(r.status().message());
        return r;
      }
      case Expr::Kind::kTest: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        absl::StatusOr<bool> r = ApplyTest(e.name, v, args);
        if (absl::IsNotFound(r.status())) return absl::InvalidArgumentError(r.status().message());
        if (!r.ok()) return r.status();
        return Value::Bool(*r != e.negated);
      }
      case Expr::Kind::kNot: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Value::Bool(!v.Truthy());
      }
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Negate(v, e.kind == Expr::Kind::kNeg);
      }
      case Expr::Kind::kBinary: {
        ASSIGN_OR_RETURN(Value l, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Value r, Eval(*e.args[1]));
        return BinaryOp(e.name, l, r);
      }
      case Expr::Kind::kAnd:
      case Expr::Kind::kOr: {
        ASSIGN_OR_RETURN(Value l, Eval(*e.args[0]));
        if (l.Truthy() == (e.kind == Expr::Kind::kOr)) return l;
        return Eval(*e.args[1]);
      }
      case Expr::Kind::kCond: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        if (c.Truthy()) return Eval(*e.args[0]);
        if (e.args[2] == nullptr) return Value();
        return Eval(*e.args[2]);
      }
    }
    return Value();
  }

  const RenderLimits limits_;
  std::vector<Scope> scopes_;
  size_t base_ = 0;  // the innermost macro's scope (0: none); scopes_[0] is always visible
  int depth_ = 0;
  int64_t steps_ = 0;
  int line_ = 0;  // the statement running (a failure's line)
};

}  // namespace

absl::StatusOr<std::unique_ptr<Template>> Template::Parse(absl::string_view source,
                                                          const ParseOptions& options) {
  ASSIGN_OR_RETURN(Body body, ParseTemplate(source, options));
  return std::unique_ptr<Template>(new Template(std::move(body)));
}

absl::StatusOr<std::string> Template::Render(const ValueDict& context,
                                             const RenderLimits& limits) const {
  std::string out;
  Renderer r(context, limits);
  RETURN_IF_ERROR(r.Run(body_, &out));
  return out;
}

}  // namespace jinja
}  // namespace moesh
