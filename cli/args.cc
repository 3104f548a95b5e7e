#include "cli/args.h"

#include <algorithm>
#include <iostream>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace moesh::cli {
namespace {

bool Accepts(const Command& c, absl::string_view flag) {
  return std::find(c.flags.begin(), c.flags.end(), flag) != c.flags.end();
}

// The flag `name` sets: itself, or for "noX" the boolean X. Null if none.
absl::CommandLineFlag* Lookup(absl::string_view name, std::string* base) {
  *base = std::string(name);
  if (absl::CommandLineFlag* f = absl::FindCommandLineFlag(name)) return f;
  if (absl::ConsumePrefix(&name, "no")) {
    absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
    if (f != nullptr && f->IsOfType<bool>()) {
      *base = std::string(name);
      return f;
    }
  }
  return nullptr;
}

void PrintHelp(const Command& command) {
  std::cout << "usage: moesh " << command.name << " " << command.synopsis << "\n"
            << "flags (--name=value or --name value):\n";
  for (const std::string& name : command.flags) {
    const absl::CommandLineFlag* f = absl::FindCommandLineFlag(name);
    if (f == nullptr) continue;
    const std::string def = f->DefaultValue();
    std::cout << "  --" << name << (def.empty() ? "" : " (default " + def + ")") << "\n      "
              << f->Help() << "\n";
  }
}

}  // namespace

absl::StatusOr<bool> ParseCommandFlags(const Command& command, const std::vector<Command>& all,
                                       const std::vector<std::string>& args) {
  for (const std::string& name : command.flags) {
    if (absl::FindCommandLineFlag(name) == nullptr) {
      return absl::InternalError(
          absl::StrCat("moesh ", command.name, " lists --", name, ", which is not defined"));
    }
  }
  bool help = false;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view a = args[i];
    // Abseil takes -name as --name, and everything after "--" as arguments.
    if (a == "--" || !absl::ConsumePrefix(&a, "-")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument \"", args[i], "\""));
    }
    absl::ConsumePrefix(&a, "-");
    const size_t eq = a.find('=');
    const absl::string_view name = a.substr(0, eq);
    if (name == "help") {
      help = true;
      continue;
    }
    if (name == "helpfull") continue;  // Abseil's: every flag of the binary
    if (absl::StrContains(name, '-')) {
      const std::string snake = absl::StrReplaceAll(name, {{"-", "_"}});
      std::string base;
      if (Lookup(snake, &base) != nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, " is spelled --", snake, " now (flags take underscores)"));
      }
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    std::string base;
    absl::CommandLineFlag* flag = Lookup(name, &base);
    if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    if (!Accepts(command, base)) {
      std::vector<std::string> owners;
      for (const Command& c : all) {
        if (Accepts(c, base)) owners.push_back("moesh " + c.name);
      }
      return absl::InvalidArgumentError(
          owners.empty()
              ? absl::StrCat("--", base, " is not a flag of moesh ", command.name)
              : absl::StrCat("--", base, " is a flag of ", absl::StrJoin(owners, " and "),
                             ", not of moesh ", command.name));
    }
    // The value, checked here so that a bad one is a one-line error.
    std::string value;
    if (eq != absl::string_view::npos) {
      value = std::string(a.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      value = base == name ? "true" : "false";
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--", base, " needs a value"));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", base, ": ", error));
    }
  }
  if (help) {
    PrintHelp(command);
    return false;
  }
  std::vector<char*> argv;
  std::string program = "moesh";
  argv.push_back(program.data());
  std::vector<std::string> copy = args;
  for (std::string& a : copy) argv.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(argv.size()), argv.data());
  return true;
}

absl::StatusOr<std::vector<int64_t>> ParseIntList(absl::string_view flag, absl::string_view text) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    int64_t x;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &x)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": \"", part, "\" is not an integer"));
    }
    out.push_back(x);
  }
  return out;
}

}  // namespace moesh::cli
