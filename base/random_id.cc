#include "base/random_id.h"

#include <sys/random.h>

#include <cerrno>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/string_view.h"

namespace moesh {

absl::StatusOr<std::string> RandomHexId(size_t bytes) {
  std::vector<char> buf(bytes);
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = getrandom(buf.data() + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::InternalError("getrandom failed: no random id");
    got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(absl::string_view(buf.data(), bytes));
}

}  // namespace moesh
