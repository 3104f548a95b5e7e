// What jinja2 gives a template beyond its syntax: operators on values, the
// attributes and items of values (Python's str, dict and list methods
// included), the filters and tests, and the global functions (range,
// namespace, dict). Each is Python's and jinja2's behaviour for the values
// of jinja_value.h; a type error is INVALID_ARGUMENT with Python's wording.
// Stateless and thread-safe.
#ifndef MOESH_COMMON_TOKENIZER_JINJA_BUILTINS_H_
#define MOESH_COMMON_TOKENIZER_JINJA_BUILTINS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/jinja_value.h"

namespace moesh {
namespace jinja {

// `a op b` for op in + - * / // % ** ~ == != < <= > >= in notin.
absl::StatusOr<Value> BinaryOp(absl::string_view op, const Value& a, const Value& b);
// -a, +a.
absl::StatusOr<Value> Negate(const Value& a, bool negate);
// obj.name, as jinja2's getattr: a method of the value's type first, then an
// item of a dict or namespace; undefined when neither exists. Accessing an
// attribute of undefined or None is INVALID_ARGUMENT.
absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name);
// obj[key]: an item first, then (for a string key) an attribute.
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] of a list or string (undefined bounds: omitted).
absl::StatusOr<Value> GetSlice(const Value& obj, const Value& start, const Value& stop,
                               const Value& step);
// value | name(args); NOT_FOUND for an unknown filter (the caller names it).
absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& value, CallArgs& args);
// value is name(args); NOT_FOUND for an unknown test.
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& value, CallArgs& args);
// range, namespace, dict; undefined for other names.
Value Global(const std::string& name);

// Helpers the filters share with the operators and methods.
bool IsIntLike(const Value& v);   // int or bool (Python's bool is an int)
int64_t AsInt(const Value& v);    // REQUIRES: IsIntLike(v)
double AsDouble(const Value& v);  // REQUIRES: IsNumeric(v)
bool IsNumeric(const Value& v);
absl::Status TypeError(absl::string_view what);  // INVALID_ARGUMENT
// The argument at `index` or named `name`; null when absent.
const Value* Arg(const CallArgs& a, size_t index, absl::string_view name);
std::string StrArg(const CallArgs& a, size_t index, absl::string_view name, std::string fallback);
bool BoolArg(const CallArgs& a, size_t index, absl::string_view name, bool fallback);
char32_t CodePoint(absl::string_view c);
bool IsPySpace(char32_t c);  // Python's str.isspace() of one character
// str.strip/lstrip/rstrip(chars) (chars null, None or undefined: whitespace).
std::string Strip(const std::string& s, const Value* chars, bool left, bool right);
// str.replace(from, to, count) (count < 0: all).
std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count);

}  // namespace jinja
}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_JINJA_BUILTINS_H_
