// The values a Jinja template computes with, as jinja2 sees its Python
// objects: undefined, None, bool, int, float, str, list (tuples read as
// lists that print as tuples), dict (insertion-ordered, string keys), a namespace() (the one
// mutable object a template may hold) and callables (the built-in functions
// and methods, and the template's macros).
//
// Printing follows Python's str() and repr() ("None", "True", "1.0",
// "['a', 1]"), equality and truth Python's; strings are UTF-8 and index by
// code point. Values share their lists and dicts (copying one is cheap);
// only a namespace changes after it is made. Not thread-safe while a
// template renders; a rendered template keeps none.
#ifndef MOESH_COMMON_TOKENIZER_JINJA_VALUE_H_
#define MOESH_COMMON_TOKENIZER_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace moesh {
namespace jinja {

class Value;
using ValueList = std::vector<Value>;
using ValueDict = std::vector<std::pair<std::string, Value>>;  // in insertion order

// A call's arguments: positional, then keyword (name, value) in call order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using Function = std::function<absl::StatusOr<Value>(CallArgs&)>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };

  Value() = default;  // undefined
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value List(ValueList items);
  // A list that prints as a Python tuple ("(1, 2)"); otherwise a list.
  static Value Tuple(ValueList items);
  static Value Dict(ValueDict items);
  static Value Namespace(ValueDict items);
  static Value Callable(std::string name, Function f);
  // JSON as Python's json.loads reads it (objects keep their key order).
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }
  // Iterable as a sequence of items (a list, a string's characters, a dict's keys).
  bool is_iterable() const;

  bool bool_value() const { return b_; }
  int64_t int_value() const { return i_; }
  double number() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : d_; }
  const std::string& str() const { return s_; }
  const ValueList& list() const { return *list_; }
  const ValueDict& dict() const { return *dict_; }
  const std::string& function_name() const { return s_; }
  const Function& function() const { return *fn_; }

  // A dict's or namespace's value for `key`; null when absent.
  const Value* Find(absl::string_view key) const;
  // namespace only: sets `key`.
  void SetAttribute(const std::string& key, Value v);

  // Python's bool(x).
  bool Truthy() const;
  // Python's str(x) (undefined prints as "").
  std::string Str() const;
  // Python's repr(x).
  std::string Repr() const;
  // Python's ==.
  bool Equals(const Value& other) const;
  // The items a for loop (or list()) takes from the value; INVALID_ARGUMENT
  // for a value that is not iterable.
  absl::StatusOr<ValueList> Items() const;
  // Python's type name, for errors ("str", "int", "dict", ...).
  const char* TypeName() const;
  // json.dumps(x, ensure_ascii=False, indent=indent (< 0: none),
  // sort_keys=sort_keys), as transformers' tojson filter writes it;
  // INVALID_ARGUMENT for what JSON cannot hold (undefined, a function).
  absl::StatusOr<std::string> ToJson(int indent, bool sort_keys) const;

 private:
  absl::Status AppendJson(int indent, bool sort_keys, int depth, std::string* out) const;

  Kind kind_ = Kind::kUndefined;
  bool b_ = false;  // kBool; kList: a tuple
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;  // kString; kFunction: its name
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<ValueDict> dict_;  // kDict (never changed), kNamespace
  std::shared_ptr<const Function> fn_;
};

// The value of `key` in `d` (a dict's items, a call's keyword arguments, a
// scope); null when absent.
const Value* FindEntry(const ValueDict& d, absl::string_view key);
// Sets `key` in `d`: in place where present, appended where not.
void SetEntry(ValueDict* d, const std::string& key, Value v);
// The characters of a UTF-8 string: each code point as its bytes (a byte
// of an ill-formed sequence alone).
std::vector<std::string> Utf8Chars(absl::string_view s);

// Python's repr() of a float ("1.0", "0.1", "1e+20", "inf", "nan").
std::string PythonFloatRepr(double d);
// `s` as Python's repr() quotes it.
std::string PythonStringRepr(absl::string_view s);

}  // namespace jinja
}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_JINJA_VALUE_H_
