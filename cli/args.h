// The `moesh` command line: a subcommand, then Abseil flags, snake_case
// (--max_new_tokens=8 or --max_new_tokens 8; a bare --json for a boolean).
// Every flag is defined once in the binary: those several subcommands share
// in cli/flags.cc, a subcommand's own in its file, --device and
// --load_format in common/service/device_flags.cc (the services' own).
// Each subcommand lists the flags it accepts, so a flag of another
// subcommand is an error naming the subcommand it belongs to, and an old
// kebab-case spelling (--max-new-tokens) one naming the new spelling.
#ifndef MOESH_CLI_ARGS_H_
#define MOESH_CLI_ARGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moesh::cli {

struct Command {
  std::string name;                // "generate"
  std::string synopsis;            // its usage, after "moesh <name> "
  std::vector<std::string> flags;  // the flags it accepts
  absl::Status (*run)();           // reads its flags; called after ParseCommandFlags
};

// Checks `args` (what follows the subcommand on the command line) against
// `command`'s flags, then parses them with absl::ParseCommandLine. `all` is
// every subcommand, to name the one a misplaced flag belongs to. Returns
// false after printing `command`'s flags for --help (the command should not
// run); INVALID_ARGUMENT for an unknown, misspelt or misplaced flag, a
// missing or bad value, or an argument that is not a flag.
absl::StatusOr<bool> ParseCommandFlags(const Command& command, const std::vector<Command>& all,
                                       const std::vector<std::string>& args);

// "5,17,300" -> {5, 17, 300}; empty for "". `flag` names the flag in errors.
absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view flag, absl::string_view text);

}  // namespace moesh::cli

#endif  // MOESH_CLI_ARGS_H_
