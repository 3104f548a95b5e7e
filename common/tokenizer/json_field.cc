#include "common/tokenizer/json_field.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace moesh {
namespace {

const nlohmann::json& Null() {
  static const nlohmann::json* const null = new nlohmann::json(nullptr);
  return *null;
}

}  // namespace

JsonField::JsonField(const nlohmann::json& value, std::string file, std::string path)
    : value_(&value), file_(std::move(file)), path_(std::move(path)) {}

JsonField JsonField::operator[](absl::string_view key) const {
  std::string path = path_.empty() ? std::string(key) : absl::StrCat(path_, ".", key);
  if (!value_->is_object()) return JsonField(Null(), file_, std::move(path));
  auto it = value_->find(std::string(key));
  return JsonField(it == value_->end() ? Null() : *it, file_, std::move(path));
}

JsonField JsonField::at(size_t i) const {
  return JsonField((*value_)[i], file_, absl::StrCat(path_, "[", i, "]"));
}

absl::Status JsonField::Error(absl::string_view what) const {
  return absl::InvalidArgumentError(
      absl::StrCat(file_, ": field ", path_.empty() ? "(top level)" : path_, ": ", what));
}

absl::Status JsonField::ExpectObject() const {
  if (value_->is_object()) return absl::OkStatus();
  return Error(is_null() ? "missing (expected an object)" : "expected an object");
}

absl::Status JsonField::ExpectArray() const {
  if (value_->is_array()) return absl::OkStatus();
  return Error(is_null() ? "missing (expected an array)" : "expected an array");
}

absl::StatusOr<std::string> JsonField::String() const {
  if (value_->is_string()) return value_->get<std::string>();
  return Error(is_null() ? "missing (expected a string)" : "expected a string");
}

absl::StatusOr<int64_t> JsonField::Int() const {
  if (value_->is_number_integer()) return value_->get<int64_t>();
  return Error(is_null() ? "missing (expected an integer)" : "expected an integer");
}

absl::StatusOr<bool> JsonField::Bool(bool if_null) const {
  if (is_null()) return if_null;
  if (value_->is_boolean()) return value_->get<bool>();
  return Error("expected true or false");
}

absl::StatusOr<std::string> JsonField::Type() const {
  if (absl::Status s = ExpectObject(); !s.ok()) return s;
  return (*this)["type"].String();
}

}  // namespace moesh
