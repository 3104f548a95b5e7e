// Options rendered back into the command-line flags that set them: what a
// supervisor (moesh serve-local, the integration tests) passes to a service
// binary. The renderers live in flag_args.cc, apart from the flag
// definitions (*_flags.cc), so that a program starting services does not
// define, and so accept, their flags itself.
#ifndef MOESH_COMMON_SERVICE_FLAG_ARGS_H_
#define MOESH_COMMON_SERVICE_FLAG_ARGS_H_

#include <string>
#include <vector>

#include "absl/flags/marshalling.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace moesh {

// Appends "--name=value" unless `value` equals `default_value` (the flag's
// default, which the binary then applies itself). Values as Abseil writes
// them (absl::UnparseFlag: numbers that parse back exactly, true/false).
template <typename T>
void AddFlag(std::vector<std::string>* args, absl::string_view name, const T& value,
             const T& default_value) {
  if (value == default_value) return;
  args->push_back(absl::StrCat("--", name, "=", absl::UnparseFlag(value)));
}

// The flags that set each of the flag groups' options `groups` (their
// AppendArgs, declared beside each group), in order: GroupArgs(o.server,
// o.worker) starts a service's ToArgs.
template <typename... Groups>
std::vector<std::string> GroupArgs(const Groups&... groups) {
  std::vector<std::string> args;
  (AppendArgs(groups, &args), ...);
  return args;
}

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_FLAG_ARGS_H_
