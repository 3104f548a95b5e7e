// jinja2's filters and tests (jinja_builtins.h: ApplyFilter, ApplyTest).
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "common/tokenizer/jinja_builtins.h"

namespace moesh {
namespace jinja {
namespace {

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(Utf8Chars(v.str()).size());
    case Value::Kind::kList:
      return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.dict().size());
    default:
      return TypeError(absl::StrCat("object of type '", v.TypeName(), "' has no len()"));
  }
}

// The attribute path `a.b.0` of `v` (jinja2's make_attrgetter).
absl::StatusOr<Value> AttrPath(const Value& v, const std::string& path) {
  Value cur = v;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    int64_t index;
    if (absl::SimpleAtoi(part, &index)) {
      ASSIGN_OR_RETURN(cur, GetItem(cur, Value::Int(index)));
    } else {
      ASSIGN_OR_RETURN(cur, GetItem(cur, Value::String(std::string(part))));
    }
  }
  return cur;
}

// The arguments after the first `skip` positional ones.
CallArgs Rest(const CallArgs& a, size_t skip) {
  CallArgs r;
  for (size_t i = skip; i < a.positional.size(); ++i) r.positional.push_back(a.positional[i]);
  r.keyword = a.keyword;
  return r;
}

// select/reject/selectattr/rejectattr.
absl::StatusOr<Value> Select(const Value& value, const CallArgs& a, bool attr, bool keep) {
  ASSIGN_OR_RETURN(ValueList items, value.Items());
  const size_t test_at = attr ? 1 : 0;
  const Value* test = Arg(a, test_at, "");
  std::string attribute;
  if (attr) {
    const Value* name = Arg(a, 0, "");
    if (name == nullptr) return TypeError("selectattr/rejectattr need an attribute");
    attribute = name->Str();
  }
  ValueList out;
  for (const Value& item : items) {
    Value subject = item;
    if (attr) {
      ASSIGN_OR_RETURN(subject, AttrPath(item, attribute));
    }
    bool pass;
    if (test == nullptr) {
      pass = subject.Truthy();
    } else {
      CallArgs targs = Rest(a, test_at + 1);
      ASSIGN_OR_RETURN(pass, ApplyTest(test->Str(), subject, targs));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::List(std::move(out));
}

absl::StatusOr<bool> Less(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_string() && b.is_string() && !case_sensitive) {
    return absl::AsciiStrToLower(a.str()) < absl::AsciiStrToLower(b.str());
  }
  ASSIGN_OR_RETURN(Value lt, BinaryOp("<", a, b));
  return lt.bool_value();
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// jinja2's indent filter.
std::string Indent(std::string s, const std::string& pad, bool first, bool blank) {
  s += "\n";
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t e = s.find('\n', pos);
    lines.push_back(s.substr(pos, e - pos));
    pos = e + 1;
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    const bool indent = i > 0 && (blank || !lines[i].empty());
    out += (indent ? pad : "") + lines[i];
  }
  if (first) out = pad + out;
  return out;
}

}  // namespace

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& value, CallArgs& a) {
  if (name == "tojson") {
    const Value* indent = Arg(a, 0, "indent");
    const int n = indent != nullptr && IsIntLike(*indent) ? static_cast<int>(AsInt(*indent)) : -1;
    ASSIGN_OR_RETURN(std::string json, value.ToJson(n, BoolArg(a, 99, "sort_keys", false)));
    return Value::String(std::move(json));
  }
  if (name == "trim") return Value::String(Strip(value.Str(), Arg(a, 0, "chars"), true, true));
  if (name == "length" || name == "count") {
    ASSIGN_OR_RETURN(int64_t n, Length(value));
    return Value::Int(n);
  }
  if (name == "string") return Value::String(value.Str());
  if (name == "lower") return Value::String(absl::AsciiStrToLower(value.Str()));
  if (name == "upper") return Value::String(absl::AsciiStrToUpper(value.Str()));
  if (name == "title" || name == "capitalize") {
    ASSIGN_OR_RETURN(Value m, GetAttr(Value::String(value.Str()), name));
    CallArgs none;
    return m.function()(none);
  }
  if (name == "replace") {
    const Value* count = Arg(a, 2, "count");
    return Value::String(Replace(value.Str(), StrArg(a, 0, "old", ""), StrArg(a, 1, "new", ""),
                                 count != nullptr && IsIntLike(*count) ? AsInt(*count) : -1));
  }
  if (name == "default" || name == "d") {
    const bool boolean = BoolArg(a, 1, "boolean", false);
    if (value.is_undefined() || (boolean && !value.Truthy())) {
      const Value* d = Arg(a, 0, "default_value");
      return d != nullptr ? *d : Value::String("");
    }
    return value;
  }
  if (name == "first" || name == "last") {
    ASSIGN_OR_RETURN(ValueList items, value.Items());
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    ASSIGN_OR_RETURN(ValueList items, value.Items());
    return Value::List(std::move(items));
  }
  if (name == "join") {
    ASSIGN_OR_RETURN(ValueList items, value.Items());
    const Value* attribute = Arg(a, 1, "attribute");
    std::vector<std::string> parts;
    for (const Value& item : items) {
      if (attribute != nullptr) {
        ASSIGN_OR_RETURN(Value v, AttrPath(item, attribute->Str()));
        parts.push_back(v.Str());
      } else {
        parts.push_back(item.Str());
      }
    }
    return Value::String(absl::StrJoin(parts, StrArg(a, 0, "d", "")));
  }
  if (name == "reverse") {
    if (value.is_string()) {
      std::vector<std::string> chars = Utf8Chars(value.str());
      std::reverse(chars.begin(), chars.end());
      return Value::String(absl::StrJoin(chars, ""));
    }
    ASSIGN_OR_RETURN(ValueList items, value.Items());
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "items") {
    if (value.is_undefined()) return Value::List({});
    if (!value.is_mapping()) return TypeError("items: not a mapping");
    ValueList out;
    for (const auto& [k, v] : value.dict()) out.push_back(Value::Tuple({Value::String(k), v}));
    return Value::List(std::move(out));
  }
  if (name == "dictsort") {
    if (!value.is_mapping()) return TypeError("dictsort: not a mapping");
    ValueDict items = value.dict();
    const bool by_value = StrArg(a, 1, "by", "key") == "value";
    std::stable_sort(items.begin(), items.end(), [&](const auto& x, const auto& y) {
      if (!by_value) return absl::AsciiStrToLower(x.first) < absl::AsciiStrToLower(y.first);
      return x.second.Str() < y.second.Str();
    });
    if (BoolArg(a, 2, "reverse", false)) std::reverse(items.begin(), items.end());
    ValueList out;
    for (auto& [k, v] : items) out.push_back(Value::Tuple({Value::String(k), v}));
    return Value::List(std::move(out));
  }
  if (name == "sort" || name == "unique" || name == "max" || name == "min") {
    ASSIGN_OR_RETURN(ValueList items, value.Items());
    const bool case_sensitive = BoolArg(a, name == "sort" ? 1 : 0, "case_sensitive", false);
    const Value* attribute = Arg(a, name == "sort" ? 2 : 1, "attribute");
    std::vector<Value> keys;
    for (const Value& item : items) {
      if (attribute == nullptr) {
        keys.push_back(item);
      } else {
        ASSIGN_OR_RETURN(Value k, AttrPath(item, attribute->Str()));
        keys.push_back(k);
      }
    }
    std::vector<size_t> order(items.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (name == "unique") {
      ValueList out;
      std::vector<Value> seen;
      for (size_t i = 0; i < items.size(); ++i) {
        Value k = keys[i];
        if (k.is_string() && !case_sensitive) k = Value::String(absl::AsciiStrToLower(k.str()));
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return s.Equals(k); })) {
          seen.push_back(k);
          out.push_back(items[i]);
        }
      }
      return Value::List(std::move(out));
    }
    absl::Status error;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      absl::StatusOr<bool> lt = Less(keys[x], keys[y], case_sensitive);
      if (!lt.ok()) error = lt.status();
      return lt.ok() && *lt;
    });
    RETURN_IF_ERROR(error);
    if (name == "max" || name == "min") {
      if (items.empty()) return Value();
      return items[name == "min" ? order.front() : order.back()];
    }
    if (BoolArg(a, 0, "reverse", false)) std::reverse(order.begin(), order.end());
    ValueList out;
    for (size_t i : order) out.push_back(items[i]);
    return Value::List(std::move(out));
  }
  if (name == "map") {
    ASSIGN_OR_RETURN(ValueList items, value.Items());
    const Value* attribute = FindEntry(a.keyword, "attribute");
    ValueList out;
    for (const Value& item : items) {
      if (attribute != nullptr) {
        ASSIGN_OR_RETURN(Value v, AttrPath(item, attribute->Str()));
        const Value* fallback = FindEntry(a.keyword, "default");
        if (v.is_undefined() && fallback != nullptr) v = *fallback;
        out.push_back(v);
      } else {
        if (a.positional.empty()) return TypeError("map: a filter name or attribute= is needed");
        CallArgs fargs = Rest(a, 1);
        ASSIGN_OR_RETURN(Value v, ApplyFilter(a.positional[0].Str(), item, fargs));
        out.push_back(v);
      }
    }
    return Value::List(std::move(out));
  }
  if (name == "select" || name == "reject") return Select(value, a, false, name == "select");
  if (name == "selectattr" || name == "rejectattr")
    return Select(value, a, true, name == "selectattr");
  if (name == "safe") return value;
  if (name == "e" || name == "escape") return Value::String(Escape(value.Str()));
  if (name == "int") {
    const Value* d = Arg(a, 0, "default");
    const Value fallback = d != nullptr ? *d : Value::Int(0);
    if (IsIntLike(value)) return Value::Int(AsInt(value));
    if (value.kind() == Value::Kind::kFloat)
      return Value::Int(static_cast<int64_t>(value.number()));
    int64_t i;
    double f;
    const std::string s(absl::StripAsciiWhitespace(value.Str()));
    if (absl::SimpleAtoi(s, &i)) return Value::Int(i);
    if (absl::SimpleAtod(s, &f)) return Value::Int(static_cast<int64_t>(f));
    return fallback;
  }
  if (name == "float") {
    const Value* d = Arg(a, 0, "default");
    if (IsNumeric(value)) return Value::Float(AsDouble(value));
    double f;
    if (absl::SimpleAtod(absl::StripAsciiWhitespace(value.Str()), &f)) return Value::Float(f);
    return d != nullptr ? *d : Value::Float(0);
  }
  if (name == "abs") {
    if (!IsNumeric(value))
      return TypeError(absl::StrCat("bad operand type for abs(): '", value.TypeName(), "'"));
    return IsIntLike(value) ? Value::Int(std::llabs(AsInt(value)))
                            : Value::Float(std::fabs(value.number()));
  }
  if (name == "round") {
    if (!IsNumeric(value)) return TypeError("round: not a number");
    const Value* p = Arg(a, 0, "precision");
    const int64_t precision = p != nullptr && IsIntLike(*p) ? AsInt(*p) : 0;
    const std::string method = StrArg(a, 1, "method", "common");
    const double scale = std::pow(10.0, static_cast<double>(precision));
    const double x = AsDouble(value) * scale;
    const double r = method == "ceil"    ? std::ceil(x)
                     : method == "floor" ? std::floor(x)
                                         : std::round(x);
    return Value::Float(r / scale);
  }
  if (name == "sum") {
    ASSIGN_OR_RETURN(ValueList items, value.Items());
    const Value* attribute = Arg(a, 0, "attribute");
    const Value* start = Arg(a, 1, "start");
    Value total = start != nullptr ? *start : Value::Int(0);
    for (const Value& item : items) {
      Value v = item;
      if (attribute != nullptr) {
        ASSIGN_OR_RETURN(v, AttrPath(item, attribute->Str()));
      }
      ASSIGN_OR_RETURN(total, BinaryOp("+", total, v));
    }
    return total;
  }
  if (name == "indent") {
    const Value* width = Arg(a, 0, "width");
    std::string pad(4, ' ');
    if (width != nullptr && IsIntLike(*width))
      pad = std::string(std::max<int64_t>(0, AsInt(*width)), ' ');
    if (width != nullptr && width->is_string()) pad = width->str();
    return Value::String(
        Indent(value.Str(), pad, BoolArg(a, 1, "first", false), BoolArg(a, 2, "blank", false)));
  }
  if (name == "wordcount") {
    ASSIGN_OR_RETURN(Value m, GetAttr(Value::String(value.Str()), "split"));
    CallArgs none;
    ASSIGN_OR_RETURN(Value words, m.function()(none));
    return Value::Int(static_cast<int64_t>(words.list().size()));
  }
  return absl::NotFoundError(absl::StrCat("no filter named '", name, "'"));
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, CallArgs& a) {
  const Value* other = Arg(a, 0, "");
  auto compare = [&](absl::string_view op) -> absl::StatusOr<bool> {
    if (other == nullptr) return TypeError(absl::StrCat("test '", name, "' needs an argument"));
    ASSIGN_OR_RETURN(Value r, BinaryOp(op, v, *other));
    return r.Truthy();
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind() == Value::Kind::kBool;
  if (name == "true") return v.kind() == Value::Kind::kBool && v.bool_value();
  if (name == "false") return v.kind() == Value::Kind::kBool && !v.bool_value();
  if (name == "integer") return v.kind() == Value::Kind::kInt;
  if (name == "float") return v.kind() == Value::Kind::kFloat;
  if (name == "number") return IsNumeric(v);
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.kind() == Value::Kind::kDict;
  if (name == "iterable") return v.is_iterable();
  if (name == "sequence")
    return v.is_string() || v.kind() == Value::Kind::kList || v.kind() == Value::Kind::kDict;
  if (name == "callable") return v.kind() == Value::Kind::kFunction;
  if (name == "lower") return v.is_string() && absl::AsciiStrToLower(v.str()) == v.str();
  if (name == "upper") return v.is_string() && absl::AsciiStrToUpper(v.str()) == v.str();
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (!IsIntLike(v)) return TypeError(absl::StrCat("test '", name, "' needs an integer"));
    const int64_t d =
        name == "divisibleby" ? (other != nullptr && IsIntLike(*other) ? AsInt(*other) : 0) : 2;
    if (d == 0) return TypeError("divisibleby: division by zero");
    const bool divisible = AsInt(v) % d == 0;
    return name == "odd" ? !divisible : divisible;
  }
  if (name == "eq" || name == "equalto" || name == "==") return compare("==");
  if (name == "ne" || name == "!=") return compare("!=");
  if (name == "lt" || name == "lessthan" || name == "<") return compare("<");
  if (name == "le" || name == "<=") return compare("<=");
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(">");
  if (name == "ge" || name == ">=") return compare(">=");
  if (name == "in") return compare("in");
  if (name == "sameas") {
    if (other == nullptr) return TypeError("test 'sameas' needs an argument");
    if (v.kind() != other->kind()) return false;
    if (v.is_mapping() || v.kind() == Value::Kind::kList)
      return false;  // identity: never the same object here
    return v.Equals(*other);
  }
  return absl::NotFoundError(absl::StrCat("no test named '", name, "'"));
}

}  // namespace jinja
}  // namespace moesh
