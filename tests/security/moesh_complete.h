// The security tests' client: `moesh complete` run as a user would, from the
// build directory (MOESH_BINARY_DIR).
#ifndef MOESH_TESTS_SECURITY_MOESH_COMPLETE_H_
#define MOESH_TESTS_SECURITY_MOESH_COMPLETE_H_

#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace moesh {

// Runs `moesh complete --server=<server> ARGS` and returns its exit status
// (pclose's; -1 if it could not start) and its output, stderr included.
inline std::pair<int, std::string> MoeshComplete(const std::string& server,
                                                 const std::string& args) {
  const std::string cmd =
      absl::StrCat(MOESH_BINARY_DIR, "/moesh complete --server=", server, " ", args, " 2>&1");
  FILE* f = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (f != nullptr && fgets(buf, sizeof(buf), f) != nullptr) out += buf;
  const int rc = f != nullptr ? pclose(f) : -1;
  return {rc, out};
}

}  // namespace moesh

#endif  // MOESH_TESTS_SECURITY_MOESH_COMPLETE_H_
