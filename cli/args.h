// Command-line flags of one `moesh` subcommand: `--name value`, `--name=value`
// and bare boolean `--name`. Every flag a command accepts is declared, so a
// typo is an error rather than silently ignored.
#ifndef MOESH_CLI_ARGS_H_
#define MOESH_CLI_ARGS_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace moesh::cli {

class Args {
 public:
  // value_flags take a value; bool_flags do not.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv,
                                    const std::set<std::string>& value_flags,
                                    const std::set<std::string>& bool_flags);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  bool Bool(const std::string& name) const { return Has(name); }
  std::optional<std::string> Get(const std::string& name) const;
  absl::StatusOr<std::string> Required(const std::string& name) const;
  absl::StatusOr<int64_t> Int(const std::string& name, int64_t fallback) const;
  absl::StatusOr<double> Double(const std::string& name, double fallback) const;
  // "5,17,300" -> {5, 17, 300}; empty if absent.
  absl::StatusOr<std::vector<int64_t>> IntList(const std::string& name) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace moesh::cli

#endif  // MOESH_CLI_ARGS_H_
