// Internal to common/model's config*.cc: the typed JSON field readers and the
// pieces the families' config files share. Not part of the model's API.
#ifndef MOESH_COMMON_MODEL_CONFIG_JSON_H_
#define MOESH_COMMON_MODEL_CONFIG_JSON_H_

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model/config.h"
#include "nlohmann/json.hpp"

namespace moesh::config_internal {

using Json = nlohmann::json;

// Typed field readers: absent or null keeps the default; a wrong type is an error.
class FieldReader {
 public:
  FieldReader(const Json& j, const std::string& source) : j_(j), source_(source) {}

  absl::Status Int(const char* key, int* out, bool required = false) const {
    if (!Has(key)) return required ? Missing(key) : absl::OkStatus();
    const Json& v = j_.at(key);
    if (!v.is_number_integer()) return WrongType(key, "an integer");
    *out = v.get<int>();
    return absl::OkStatus();
  }
  absl::Status Double(const char* key, double* out) const {
    if (!Has(key)) return absl::OkStatus();
    const Json& v = j_.at(key);
    if (!v.is_number()) return WrongType(key, "a number");
    *out = v.get<double>();
    return absl::OkStatus();
  }
  absl::Status Bool(const char* key, bool* out) const {
    if (!Has(key)) return absl::OkStatus();
    const Json& v = j_.at(key);
    if (!v.is_boolean()) return WrongType(key, "true or false");
    *out = v.get<bool>();
    return absl::OkStatus();
  }
  absl::Status String(const char* key, std::string* out) const {
    if (!Has(key)) return absl::OkStatus();
    const Json& v = j_.at(key);
    if (!v.is_string()) return WrongType(key, "a string");
    *out = v.get<std::string>();
    return absl::OkStatus();
  }
  bool Has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

 private:
  absl::Status Missing(const char* key) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": required field \"", key, "\" is missing"));
  }
  absl::Status WrongType(const char* key, const char* want) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": field \"", key, "\" must be ", want, ", got ", j_.at(key).dump()));
  }
  const Json& j_;
  const std::string& source_;
};

// rope_parameters / rope_scaling into `rope` (`where` names it in errors).
absl::Status ParseRope(const Json& params, const std::string& where, RopeConfig* rope);
// eos_token_id: an integer or a list of them.
absl::Status ParseEos(const Json& j, const std::string& source, std::vector<int>* out);
// `r` in transformers' rope_parameters form.
Json RopeJson(const RopeConfig& r, double partial_rotary_factor);

// DeepSeek-V4 (config_v4.cc): its fields into `c`, and `c` back as
// transformers' DeepseekV4Config writes it.
absl::Status ParseV4(const Json& j, const std::string& source, ModelConfig* c);

// A config field for CheckPositive: its config.json name and value.
struct NamedInt {
  const char* name;
  int value;
};
// INVALID_ARGUMENT "<source>: <name> must be positive, got <value>" for the
// first field that is not.
absl::Status CheckPositive(const std::string& source, std::initializer_list<NamedInt> fields);
std::string V4ToJson(const ModelConfig& c);

}  // namespace moesh::config_internal

#endif  // MOESH_COMMON_MODEL_CONFIG_JSON_H_
