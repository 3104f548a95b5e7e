#include "common/tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/utf8.h"

namespace moesh {
namespace jinja {

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::Float(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.d_ = d;
  return v;
}

Value Value::String(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::move(s);
  return v;
}

Value Value::List(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::Tuple(ValueList items) {
  Value v = List(std::move(items));
  v.b_ = true;
  return v;
}

Value Value::Dict(ValueDict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<ValueDict>(std::move(items));
  return v;
}

Value Value::Namespace(ValueDict items) {
  Value v = Dict(std::move(items));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::Callable(std::string name, Function f) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.s_ = std::move(name);
  v.fn_ = std::make_shared<const Function>(std::move(f));
  return v;
}

Value Value::FromJson(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return None();
    case nlohmann::ordered_json::value_t::boolean:
      return Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? Float(static_cast<double>(u))
                                                  : Int(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return String(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(FromJson(e));
      return List(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict items;
      items.reserve(j.size());
      for (const auto& [k, e] : j.items()) items.emplace_back(k, FromJson(e));
      return Dict(std::move(items));
    }
    default:
      return None();
  }
}

bool Value::is_iterable() const {
  return kind_ == Kind::kList || kind_ == Kind::kString || kind_ == Kind::kDict ||
         kind_ == Kind::kUndefined;
}

const Value* FindEntry(const ValueDict& d, absl::string_view key) {
  for (const auto& [k, v] : d) {
    if (k == key) return &v;
  }
  return nullptr;
}

void SetEntry(ValueDict* d, const std::string& key, Value v) {
  for (auto& [k, old] : *d) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  d->emplace_back(key, std::move(v));
}

std::vector<std::string> Utf8Chars(absl::string_view s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const Utf8Step step = DecodeUtf8At(s, i);
    out.emplace_back(s.substr(i, step.length));
    i += step.length;
  }
  return out;
}

const Value* Value::Find(absl::string_view key) const {
  return is_mapping() ? FindEntry(*dict_, key) : nullptr;
}

void Value::SetAttribute(const std::string& key, Value v) {
  SetEntry(dict_.get(), key, std::move(v));
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return d_ != 0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string PythonFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  // The shortest digits that read back as `d`, as d.ddde±XX.
  const std::to_chars_result r =
      std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  const int exponent = std::atoi(sci.c_str() + e + 1);
  std::string mantissa = sci.substr(0, e);
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(-exponent - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exponent + 1) {
      out += digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  absl::StrAppend(&out, "e", exponent < 0 ? "-" : "+", absl::StrFormat("%02d", std::abs(exponent)));
  return out;
}

std::string PythonStringRepr(absl::string_view s) {
  const bool has_single = s.find('\'') != absl::string_view::npos;
  const bool has_double = s.find('"') != absl::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const Utf8Step step = DecodeUtf8At(s, i);
    const char32_t c = step.kind == Utf8Step::kValid ? step.code_point : 0xFFFD;
    if (c == '\\' || c == static_cast<char32_t>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || (c >= 0x7F && c < 0xA0)) {
      out += absl::StrFormat("\\x%02x", static_cast<unsigned>(c));
    } else {
      AppendUtf8(c, &out);
    }
    i += step.length;
  }
  out += quote;
  return out;
}

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return s_;
    case Kind::kNamespace:
      return "<Namespace " + Repr() + ">";
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(i_);
    case Kind::kFloat:
      return PythonFloatRepr(d_);
    case Kind::kString:
      return PythonStringRepr(s_);
    case Kind::kList: {
      std::string out = b_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i > 0) out += ", ";
        out += (*list_)[i].Repr();
      }
      if (b_ && list_->size() == 1) out += ",";
      return out + (b_ ? ")" : "]");
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::string out = "{";
      for (size_t i = 0; i < dict_->size(); ++i) {
        if (i > 0) out += ", ";
        absl::StrAppend(&out, PythonStringRepr((*dict_)[i].first), ": ", (*dict_)[i].second.Repr());
      }
      return out + "}";
    }
    case Kind::kFunction:
      return absl::StrCat("<function ", s_, ">");
  }
  return "";
}

bool Value::Equals(const Value& o) const {
  const bool numeric = kind_ == Kind::kBool || is_number();
  const bool other_numeric = o.kind_ == Kind::kBool || o.is_number();
  if (numeric && other_numeric) {
    if (kind_ != Kind::kFloat && o.kind_ != Kind::kFloat) {
      const int64_t a = kind_ == Kind::kBool ? b_ : i_;
      const int64_t b = o.kind_ == Kind::kBool ? o.b_ : o.i_;
      return a == b;
    }
    const double a = kind_ == Kind::kBool ? b_ : number();
    const double b = o.kind_ == Kind::kBool ? o.b_ : o.number();
    return a == b;
  }
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return s_ == o.s_;
    case Kind::kList:
      if (list_->size() != o.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*o.list_)[i])) return false;
      }
      return true;
    case Kind::kDict:
      if (dict_->size() != o.dict_->size()) return false;
      for (const auto& [k, v] : *dict_) {
        const Value* w = o.Find(k);
        if (w == nullptr || !v.Equals(*w)) return false;
      }
      return true;
    case Kind::kNamespace:
      return dict_ == o.dict_;
    case Kind::kFunction:
      return fn_ == o.fn_;
    default:
      return false;
  }
}

absl::StatusOr<ValueList> Value::Items() const {
  switch (kind_) {
    case Kind::kUndefined:
      return ValueList();
    case Kind::kList:
      return *list_;
    case Kind::kDict: {
      ValueList keys;
      for (const auto& [k, v] : *dict_) keys.push_back(String(k));
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      for (std::string& c : Utf8Chars(s_)) chars.push_back(String(std::move(c)));
      return chars;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("'", TypeName(), "' object is not iterable"));
  }
}

const char* Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunction:
      return "function";
  }
  return "";
}

namespace {

// A JSON string as json.dumps(ensure_ascii=False) writes it.
void AppendJsonString(absl::string_view s, std::string* out) {
  *out += '"';
  for (char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20) {
          *out += absl::StrFormat("\\u%04x", c);
        } else {
          *out += ch;
        }
    }
  }
  *out += '"';
}

void AppendNewline(int indent, int depth, std::string* out) {
  *out += '\n';
  out->append(static_cast<size_t>(indent) * depth, ' ');
}

}  // namespace

absl::StatusOr<std::string> Value::ToJson(int indent, bool sort_keys) const {
  std::string out;
  absl::Status s = AppendJson(indent, sort_keys, 0, &out);
  if (!s.ok()) return s;
  return out;
}

absl::Status Value::AppendJson(int indent, bool sort_keys, int depth, std::string* out) const {
  if (depth > 256) return absl::InvalidArgumentError("tojson: nesting too deep");
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (kind_) {
    case Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Kind::kBool:
      *out += b_ ? "true" : "false";
      return absl::OkStatus();
    case Kind::kInt:
      absl::StrAppend(out, i_);
      return absl::OkStatus();
    case Kind::kFloat:
      if (std::isnan(d_)) {
        *out += "NaN";
      } else if (std::isinf(d_)) {
        *out += d_ > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += PythonFloatRepr(d_);
      }
      return absl::OkStatus();
    case Kind::kString:
      AppendJsonString(s_, out);
      return absl::OkStatus();
    case Kind::kList: {
      if (list_->empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      *out += '[';
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i > 0) *out += item_sep;
        if (indent >= 0) AppendNewline(indent, depth + 1, out);
        absl::Status s = (*list_)[i].AppendJson(indent, sort_keys, depth + 1, out);
        if (!s.ok()) return s;
      }
      if (indent >= 0) AppendNewline(indent, depth, out);
      *out += ']';
      return absl::OkStatus();
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      if (dict_->empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : *dict_) items.push_back(&item);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      *out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) *out += item_sep;
        if (indent >= 0) AppendNewline(indent, depth + 1, out);
        AppendJsonString(items[i]->first, out);
        *out += ": ";
        absl::Status s = items[i]->second.AppendJson(indent, sort_keys, depth + 1, out);
        if (!s.ok()) return s;
      }
      if (indent >= 0) AppendNewline(indent, depth, out);
      *out += '}';
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: Object of type ", TypeName(), " is not JSON serializable"));
  }
}

}  // namespace jinja
}  // namespace moesh
