#include "cli/args.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace moesh::cli {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv,
                                 const std::set<std::string>& value_flags,
                                 const std::set<std::string>& bool_flags) {
  Args args;
  for (size_t i = 0; i < argv.size(); ++i) {
    absl::string_view a = argv[i];
    if (!absl::ConsumePrefix(&a, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", argv[i], "\""));
    }
    std::string name(a), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (bool_flags.count(name)) {
      if (has_value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      args.values_[name] = "true";
    } else if (value_flags.count(name)) {
      if (!has_value) {
        if (i + 1 >= argv.size())
          return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        value = argv[++i];
      }
      args.values_[name] = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
  }
  return args;
}

std::optional<std::string> Args::Get(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

absl::StatusOr<std::string> Args::Required(const std::string& name) const {
  auto v = Get(name);
  if (!v) return absl::InvalidArgumentError(absl::StrCat("--", name, " is required"));
  return *v;
}

absl::StatusOr<int64_t> Args::Int(const std::string& name, int64_t fallback) const {
  auto v = Get(name);
  if (!v) return fallback;
  int64_t out;
  if (!absl::SimpleAtoi(*v, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be an integer, got \"", *v, "\""));
  }
  return out;
}

absl::StatusOr<double> Args::Double(const std::string& name, double fallback) const {
  auto v = Get(name);
  if (!v) return fallback;
  double out;
  if (!absl::SimpleAtod(*v, &out)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", name, " must be a number, got \"", *v, "\""));
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> Args::IntList(const std::string& name) const {
  std::vector<int64_t> out;
  auto v = Get(name);
  if (!v) return out;
  for (absl::string_view part : absl::StrSplit(*v, ',', absl::SkipWhitespace())) {
    int64_t x;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &x)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": \"", part, "\" is not an integer"));
    }
    out.push_back(x);
  }
  return out;
}

}  // namespace moesh::cli
