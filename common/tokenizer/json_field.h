// Reading tokenizer.json with errors that name the file and the field:
//   INVALID_ARGUMENT "tokenizer.json: field model.merges[3]: expected a string or a pair".
// A JsonField is a view of a value inside a parsed document plus the path that led
// to it; a missing member reads as null. It never throws. Cheap to copy; valid while
// the document lives.
#ifndef MOESH_COMMON_TOKENIZER_JSON_FIELD_H_
#define MOESH_COMMON_TOKENIZER_JSON_FIELD_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace moesh {

class JsonField {
 public:
  // `file` names the document in messages; `path` is this value's field path ("" at the top).
  JsonField(const nlohmann::json& value, std::string file, std::string path);

  const nlohmann::json& value() const { return *value_; }
  const std::string& file() const { return file_; }
  const std::string& path() const { return path_; }
  bool is_null() const { return value_->is_null(); }

  // Member `key` of an object (null if absent or if this is no object).
  JsonField operator[](absl::string_view key) const;
  // Element `i`. REQUIRES: value().is_array() && i < value().size().
  JsonField at(size_t i) const;

  // INVALID_ARGUMENT "<file>: field <path>: <what>".
  absl::Status Error(absl::string_view what) const;

  absl::Status ExpectObject() const;
  absl::Status ExpectArray() const;
  absl::StatusOr<std::string> String() const;
  absl::StatusOr<int64_t> Int() const;
  // `if_null` when null or absent.
  absl::StatusOr<bool> Bool(bool if_null) const;
  // The "type" member of an object, as pre_tokenizer/normalizer/... objects carry it.
  absl::StatusOr<std::string> Type() const;

 private:
  const nlohmann::json* value_;
  std::string file_;
  std::string path_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_JSON_FIELD_H_
