#include "common/tokenizer/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "common/tokenizer/utf8.h"

namespace moesh {
namespace jinja {

bool IsIntLike(const Value& v) {
  return v.kind() == Value::Kind::kInt || v.kind() == Value::Kind::kBool;
}
int64_t AsInt(const Value& v) {
  return v.kind() == Value::Kind::kBool ? v.bool_value() : v.int_value();
}
double AsDouble(const Value& v) {
  return v.kind() == Value::Kind::kBool ? v.bool_value() : v.number();
}
bool IsNumeric(const Value& v) { return v.is_number() || v.kind() == Value::Kind::kBool; }

absl::Status TypeError(absl::string_view what) { return absl::InvalidArgumentError(what); }

// The argument at `index` or named `name`; null when absent.
const Value* Arg(const CallArgs& a, size_t index, absl::string_view name) {
  if (index < a.positional.size()) return &a.positional[index];
  return FindEntry(a.keyword, name);
}

std::string StrArg(const CallArgs& a, size_t index, absl::string_view name, std::string fallback) {
  const Value* v = Arg(a, index, name);
  return v == nullptr || v->is_undefined() ? fallback : v->Str();
}

bool BoolArg(const CallArgs& a, size_t index, absl::string_view name, bool fallback) {
  const Value* v = Arg(a, index, name);
  return v == nullptr || v->is_undefined() ? fallback : v->Truthy();
}

char32_t CodePoint(absl::string_view c) {
  const Utf8Step step = DecodeUtf8At(c, 0);
  return step.kind == Utf8Step::kValid ? step.code_point : 0xFFFD;
}

// Python's str.isspace() for one character.
bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// str.strip/lstrip/rstrip(chars).
std::string Strip(const std::string& s, const Value* chars, bool left, bool right) {
  const std::vector<std::string> cs = Utf8Chars(s);
  std::vector<std::string> set;
  const bool whitespace = chars == nullptr || chars->is_none() || chars->is_undefined();
  if (!whitespace) set = Utf8Chars(chars->Str());
  auto strip = [&](const std::string& c) {
    return whitespace ? IsPySpace(CodePoint(c)) : std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cs.size();
  while (left && b < e && strip(cs[b])) ++b;
  while (right && e > b && strip(cs[e - 1])) --e;
  std::string out;
  for (size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count) {
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    std::string out;
    int64_t n = 0;
    for (const std::string& c : Utf8Chars(s)) {
      if (count < 0 || n++ < count) out += to;
      out += c;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  std::string out;
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(from, pos);
    if (f == std::string::npos) break;
    out.append(s, pos, f - pos);
    out += to;
    pos = f + from.size();
    ++n;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

namespace {

// str.split(sep, maxsplit) (from the right: rsplit).
absl::StatusOr<Value> Split(const std::string& s, const CallArgs& a, bool from_right) {
  const Value* sep = Arg(a, 0, "sep");
  const Value* max = Arg(a, 1, "maxsplit");
  int64_t maxsplit = max == nullptr || !max->is_number() ? -1 : max->int_value();
  std::vector<std::string> parts;
  if (sep == nullptr || sep->is_none()) {
    std::vector<std::string> cs = Utf8Chars(s);
    if (from_right) std::reverse(cs.begin(), cs.end());
    size_t i = 0;
    while (i < cs.size()) {
      while (i < cs.size() && IsPySpace(CodePoint(cs[i]))) ++i;
      if (i >= cs.size()) break;
      std::string word;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t e = cs.size();
        while (e > i && IsPySpace(CodePoint(cs[e - 1]))) --e;
        for (size_t k = i; k < e; ++k) word += cs[k];
        i = cs.size();
      } else {
        while (i < cs.size() && !IsPySpace(CodePoint(cs[i]))) word += cs[i++];
      }
      parts.push_back(word);
    }
    if (from_right) {
      for (std::string& p : parts) {
        std::vector<std::string> pc = Utf8Chars(p);
        std::reverse(pc.begin(), pc.end());
        p = absl::StrJoin(pc, "");
      }
      std::reverse(parts.begin(), parts.end());
    }
  } else {
    const std::string d = sep->Str();
    if (d.empty()) return TypeError("empty separator");
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        const size_t f = s.find(d, pos);
        if (f == std::string::npos) break;
        parts.push_back(s.substr(pos, f - pos));
        pos = f + d.size();
      }
      parts.push_back(s.substr(pos));
    } else {
      size_t end = s.size();
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        if (end < d.size()) break;
        const size_t f = s.rfind(d, end - d.size());
        if (f == std::string::npos) break;
        parts.push_back(s.substr(f + d.size(), end - f - d.size()));
        end = f;
      }
      parts.push_back(s.substr(0, end));
      std::reverse(parts.begin(), parts.end());
    }
  }
  ValueList out;
  for (std::string& p : parts) out.push_back(Value::String(std::move(p)));
  return Value::List(std::move(out));
}

std::string Title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const bool alpha = absl::ascii_isalpha(static_cast<unsigned char>(c));
    if (alpha) c = start ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
    start = !alpha && !absl::ascii_isdigit(static_cast<unsigned char>(c)) && c != '\'';
  }
  return out;
}

std::string Capitalize(const std::string& s) {
  std::string out = absl::AsciiStrToLower(s);
  if (!out.empty()) out[0] = absl::ascii_toupper(out[0]);
  return out;
}

absl::StatusOr<Value> StringMethod(const Value& obj, const std::string& name) {
  const std::string s = obj.str();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip", right = name != "lstrip";
    return Value::Callable(name, [s, left, right](CallArgs& a) -> absl::StatusOr<Value> {
      return Value::String(Strip(s, Arg(a, 0, "chars"), left, right));
    });
  }
  if (name == "split" || name == "rsplit") {
    const bool right = name == "rsplit";
    return Value::Callable(name, [s, right](CallArgs& a) { return Split(s, a, right); });
  }
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return Value::Callable(name, [s, start](CallArgs& a) -> absl::StatusOr<Value> {
      const Value* p = Arg(a, 0, "prefix");
      if (p == nullptr) return TypeError("startswith/endswith takes an argument");
      ValueList options = p->kind() == Value::Kind::kList ? p->list() : ValueList{*p};
      for (const Value& o : options) {
        if (!o.is_string()) return TypeError("startswith/endswith takes a str or a tuple of str");
        if (start ? absl::StartsWith(s, o.str()) : absl::EndsWith(s, o.str()))
          return Value::Bool(true);
      }
      return Value::Bool(false);
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return Value::Callable(name, [s, name](CallArgs&) -> absl::StatusOr<Value> {
      if (name == "upper") return Value::String(absl::AsciiStrToUpper(s));
      if (name == "lower") return Value::String(absl::AsciiStrToLower(s));
      return Value::String(name == "title" ? Title(s) : Capitalize(s));
    });
  }
  if (name == "replace") {
    return Value::Callable(name, [s](CallArgs& a) -> absl::StatusOr<Value> {
      const Value* count = Arg(a, 2, "count");
      return Value::String(
          Replace(s, StrArg(a, 0, "old", ""), StrArg(a, 1, "new", ""),
                  count != nullptr && count->is_number() ? count->int_value() : -1));
    });
  }
  if (name == "find" || name == "count") {
    const bool find = name == "find";
    return Value::Callable(name, [s, find](CallArgs& a) -> absl::StatusOr<Value> {
      const std::string sub = StrArg(a, 0, "sub", "");
      if (find) {
        const size_t f = s.find(sub);
        if (f == std::string::npos) return Value::Int(-1);
        return Value::Int(static_cast<int64_t>(Utf8Chars(s.substr(0, f)).size()));
      }
      if (sub.empty()) return Value::Int(static_cast<int64_t>(Utf8Chars(s).size()) + 1);
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value::Int(n);
    });
  }
  if (name == "join") {
    return Value::Callable(name, [s](CallArgs& a) -> absl::StatusOr<Value> {
      const Value* items = Arg(a, 0, "iterable");
      if (items == nullptr) return TypeError("join() takes exactly one argument");
      ASSIGN_OR_RETURN(ValueList list, items->Items());
      std::vector<std::string> parts;
      for (const Value& v : list) {
        if (!v.is_string())
          return TypeError(
              absl::StrCat("sequence item: expected str instance, ", v.TypeName(), " found"));
        parts.push_back(v.str());
      }
      return Value::String(absl::StrJoin(parts, s));
    });
  }
  if (name == "splitlines") {
    return Value::Callable(name, [s](CallArgs&) -> absl::StatusOr<Value> {
      ValueList out;
      size_t pos = 0;
      while (pos < s.size()) {
        size_t e = s.find_first_of("\n\r", pos);
        if (e == std::string::npos) e = s.size();
        out.push_back(Value::String(s.substr(pos, e - pos)));
        pos = e + (s.compare(e, 2, "\r\n") == 0 ? 2 : 1);
      }
      return Value::List(std::move(out));
    });
  }
  return Value();
}

absl::StatusOr<Value> DictMethod(const Value& obj, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return Value::Callable(name, [obj, name](CallArgs&) -> absl::StatusOr<Value> {
      ValueList out;
      for (const auto& [k, v] : obj.dict()) {
        if (name == "items") out.push_back(Value::Tuple({Value::String(k), v}));
        if (name == "keys") out.push_back(Value::String(k));
        if (name == "values") out.push_back(v);
      }
      return Value::List(std::move(out));
    });
  }
  if (name == "get") {
    return Value::Callable(name, [obj](CallArgs& a) -> absl::StatusOr<Value> {
      const Value* key = Arg(a, 0, "key");
      const Value* fallback = Arg(a, 1, "default");
      const Value* v = key != nullptr && key->is_string() ? obj.Find(key->str()) : nullptr;
      if (v != nullptr) return *v;
      return fallback != nullptr ? *fallback : Value::None();
    });
  }
  if (name == "update" || name == "pop" || name == "setdefault" || name == "clear" ||
      name == "popitem") {
    return Value::Callable(name, [name](CallArgs&) -> absl::StatusOr<Value> {
      return TypeError(
          absl::StrCat("access to dict.", name, " is unsafe: a template cannot change a dict"));
    });
  }
  return Value();
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        return TypeError(
            absl::StrCat("'in <string>' requires string as left operand, not ", item.TypeName()));
      }
      return absl::StrContains(container.str(), item.str());
    case Value::Kind::kList:
      for (const Value& v : container.list()) {
        if (v.Equals(item)) return true;
      }
      return false;
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      return item.is_string() && container.Find(item.str()) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    default:
      return TypeError(
          absl::StrCat("argument of type '", container.TypeName(), "' is not iterable"));
  }
}

absl::StatusOr<int> Compare(absl::string_view op, const Value& a, const Value& b) {
  if (IsNumeric(a) && IsNumeric(b)) {
    if (IsIntLike(a) && IsIntLike(b)) return AsInt(a) < AsInt(b) ? -1 : AsInt(a) > AsInt(b) ? 1 : 0;
    const double x = AsDouble(a), y = AsDouble(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str() ? -1 : a.str() > b.str() ? 1 : 0;
  return TypeError(absl::StrCat("'", op, "' not supported between instances of '", a.TypeName(),
                                "' and '", b.TypeName(), "'"));
}

// Python's slice.indices: the positions a[start:stop:step] takes.
absl::StatusOr<std::vector<int64_t>> SliceIndices(int64_t n, const Value& start, const Value& stop,
                                                  const Value& step) {
  auto given = [](const Value& v) { return !v.is_undefined() && !v.is_none(); };
  for (const Value* v : {&start, &stop, &step}) {
    if (given(*v) && !IsIntLike(*v)) return TypeError("slice indices must be integers or None");
  }
  const int64_t s = given(step) ? AsInt(step) : 1;
  if (s == 0) return TypeError("slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t fallback) {
    if (!given(v)) return fallback;
    int64_t i = AsInt(v);
    if (i < 0) i += n;
    if (s > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, s > 0 ? 0 : n - 1);
  const int64_t e = clamp(stop, s > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = b; s > 0 ? i < e : i > e; i += s) out.push_back(i);
  return out;
}

}  // namespace

absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b) {
  if (op == "~") return Value::String(a.Str() + b.Str());
  if (op == "==") return Value::Bool(a.Equals(b));
  if (op == "!=") return Value::Bool(!a.Equals(b));
  if (op == "in" || op == "notin") {
    ASSIGN_OR_RETURN(bool in, Contains(b, a));
    return Value::Bool(op == "in" ? in : !in);
  }
  if (a.is_undefined() || b.is_undefined()) {
    return TypeError(absl::StrCat("an undefined value in '", op, "'"));
  }
  if (op == "<" || op == "<=" || op == ">" || op == ">=") {
    ASSIGN_OR_RETURN(int c, Compare(op, a, b));
    if (op == "<") return Value::Bool(c < 0);
    if (op == "<=") return Value::Bool(c <= 0);
    if (op == ">") return Value::Bool(c > 0);
    return Value::Bool(c >= 0);
  }
  if (op == "+" && a.is_string() && b.is_string()) return Value::String(a.str() + b.str());
  if (op == "+" && a.kind() == Value::Kind::kList && b.kind() == Value::Kind::kList) {
    ValueList out = a.list();
    out.insert(out.end(), b.list().begin(), b.list().end());
    return Value::List(std::move(out));
  }
  if (op == "*" && (a.is_string() || a.kind() == Value::Kind::kList) && IsIntLike(b)) {
    const int64_t n = AsInt(b);
    if (a.is_string()) {
      if (n > 0 && a.str().size() * n > (64u << 20))
        return TypeError("string repetition too large");
      std::string out;
      out.reserve(n > 0 ? a.str().size() * n : 0);
      for (int64_t i = 0; i < n; ++i) out += a.str();
      return Value::String(std::move(out));
    }
    if (n > 0 && a.list().size() * n > (1u << 20)) return TypeError("list repetition too large");
    ValueList out;
    for (int64_t i = 0; i < n; ++i) out.insert(out.end(), a.list().begin(), a.list().end());
    return Value::List(std::move(out));
  }
  if (!IsNumeric(a) || !IsNumeric(b)) {
    if (op == "+" && a.is_string()) {
      return TypeError(
          absl::StrCat("can only concatenate str (not \"", b.TypeName(), "\") to str"));
    }
    return TypeError(absl::StrCat("unsupported operand type(s) for ", op, ": '", a.TypeName(),
                                  "' and '", b.TypeName(), "'"));
  }
  const bool ints = IsIntLike(a) && IsIntLike(b);
  const double x = AsDouble(a), y = AsDouble(b);
  if (op == "/") {
    if (y == 0) return TypeError("division by zero");
    return Value::Float(x / y);
  }
  if (ints) {
    const int64_t i = AsInt(a), j = AsInt(b);
    if (op == "+") return Value::Int(i + j);
    if (op == "-") return Value::Int(i - j);
    if (op == "*") return Value::Int(i * j);
    if (op == "//" || op == "%") {
      if (j == 0) return TypeError("integer division or modulo by zero");
      int64_t q = i / j, r = i % j;
      if (r != 0 && ((r < 0) != (j < 0))) --q, r += j;
      return Value::Int(op == "//" ? q : r);
    }
    if (op == "**" && j >= 0) {
      int64_t p = 1;
      for (int64_t k = 0; k < j && k < 64; ++k) p *= i;
      return Value::Int(p);
    }
  }
  if (op == "+") return Value::Float(x + y);
  if (op == "-") return Value::Float(x - y);
  if (op == "*") return Value::Float(x * y);
  if (op == "**") return Value::Float(std::pow(x, y));
  if (op == "//" || op == "%") {
    if (y == 0) return TypeError("float division or modulo by zero");
    const double q = std::floor(x / y);
    return Value::Float(op == "//" ? q : x - q * y);
  }
  return TypeError(absl::StrCat("unknown operator '", op, "'"));
}

absl::StatusOr<Value> Negate(const Value& a, bool negate) {
  if (!IsNumeric(a))
    return TypeError(absl::StrCat("bad operand type for unary -: '", a.TypeName(), "'"));
  if (!negate) return IsIntLike(a) ? Value::Int(AsInt(a)) : a;
  return IsIntLike(a) ? Value::Int(-AsInt(a)) : Value::Float(-a.number());
}

absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      return TypeError(absl::StrCat("an undefined value has no attribute '", name, "'"));
    case Value::Kind::kString:
      return StringMethod(obj, name);
    case Value::Kind::kDict: {
      ASSIGN_OR_RETURN(Value m, DictMethod(obj, name));
      if (!m.is_undefined()) return m;
      const Value* v = obj.Find(name);
      return v != nullptr ? *v : Value();
    }
    case Value::Kind::kNamespace: {
      const Value* v = obj.Find(name);
      return v != nullptr ? *v : Value();
    }
    case Value::Kind::kList:
      if (name == "append" || name == "extend" || name == "pop" || name == "insert" ||
          name == "remove" || name == "clear" || name == "sort" || name == "reverse") {
        return Value::Callable(name, [name](CallArgs&) -> absl::StatusOr<Value> {
          return TypeError(
              absl::StrCat("access to list.", name, " is unsafe: a template cannot change a list"));
        });
      }
      return Value();
    default:
      return Value();
  }
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return TypeError("an undefined value has no items");
  if ((obj.kind() == Value::Kind::kList || obj.is_string()) && IsIntLike(key)) {
    std::vector<std::string> chars;
    if (obj.is_string()) chars = Utf8Chars(obj.str());
    const int64_t n = obj.is_string() ? chars.size() : obj.list().size();
    int64_t i = AsInt(key);
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();
    return obj.is_string() ? Value::String(chars[i]) : obj.list()[i];
  }
  if (obj.is_mapping() && key.is_string()) {
    const Value* v = obj.Find(key.str());
    if (v != nullptr) return *v;
  }
  if (key.is_string()) return GetAttr(obj, key.str());
  return Value();
}

absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop,
                               const Value& step) {
  if (obj.is_string()) {
    const std::vector<std::string> chars = Utf8Chars(obj.str());
    ASSIGN_OR_RETURN(std::vector<int64_t> idx, SliceIndices(chars.size(), start, stop, step));
    std::string out;
    for (int64_t i : idx) out += chars[i];
    return Value::String(std::move(out));
  }
  if (obj.kind() == Value::Kind::kList) {
    ASSIGN_OR_RETURN(std::vector<int64_t> idx, SliceIndices(obj.list().size(), start, stop, step));
    ValueList out;
    for (int64_t i : idx) out.push_back(obj.list()[i]);
    return Value::List(std::move(out));
  }
  if (obj.is_undefined()) return TypeError("an undefined value cannot be sliced");
  return TypeError(absl::StrCat("'", obj.TypeName(), "' object is not subscriptable"));
}

Value Global(const std::string& name) {
  if (name == "range") {
    return Value::Callable("range", [](CallArgs& a) -> absl::StatusOr<Value> {
      for (const Value& v : a.positional) {
        if (!IsIntLike(v))
          return TypeError(
              absl::StrCat("'", v.TypeName(), "' object cannot be interpreted as an integer"));
      }
      int64_t start = 0, stop = 0, step = 1;
      if (a.positional.size() == 1) {
        stop = AsInt(a.positional[0]);
      } else if (a.positional.size() == 2 || a.positional.size() == 3) {
        start = AsInt(a.positional[0]);
        stop = AsInt(a.positional[1]);
        if (a.positional.size() == 3) step = AsInt(a.positional[2]);
      } else {
        return TypeError("range expected 1 to 3 arguments");
      }
      if (step == 0) return TypeError("range() arg 3 must not be zero");
      const int64_t n =
          step > 0 ? (stop - start + step - 1) / step : (start - stop - step - 1) / -step;
      if (n > 100000)
        return TypeError("range too big: the sandbox blocks ranges of more than 100000 items");
      ValueList out;
      for (int64_t i = 0; i < n; ++i) out.push_back(Value::Int(start + i * step));
      return Value::List(std::move(out));
    });
  }
  if (name == "namespace" || name == "dict") {
    const bool ns = name == "namespace";
    return Value::Callable(name, [ns](CallArgs& a) -> absl::StatusOr<Value> {
      ValueDict items;
      for (const Value& p : a.positional) {
        if (!p.is_mapping())
          return TypeError("namespace() and dict() take a mapping or keyword arguments");
        for (const auto& item : p.dict()) items.push_back(item);
      }
      for (const auto& [k, v] : a.keyword) SetEntry(&items, k, v);
      return ns ? Value::Namespace(std::move(items)) : Value::Dict(std::move(items));
    });
  }
  return Value();
}

}  // namespace jinja
}  // namespace moesh
