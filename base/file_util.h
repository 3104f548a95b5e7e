// Small file helpers returning absl::Status with the path in every message.
#ifndef MOESH_COMMON_BASE_FILE_UTIL_H_
#define MOESH_COMMON_BASE_FILE_UTIL_H_

#include <string>

#include "absl/status/statusor.h"

namespace moesh {

// NOT_FOUND if `path` does not exist, INTERNAL on read errors.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);
absl::Status WriteStringToFile(const std::string& path, const std::string& contents);
bool FileExists(const std::string& path);
// Creates `dir` and its parents; OK if it exists.
absl::Status MakeDirs(const std::string& dir);
std::string JoinPath(const std::string& dir, const std::string& name);

}  // namespace moesh

#endif  // MOESH_COMMON_BASE_FILE_UTIL_H_
