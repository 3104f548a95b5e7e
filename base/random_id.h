// Ids nobody can guess: bytes from the kernel's CSPRNG (getrandom), in hex.
#ifndef MOESH_BASE_RANDOM_ID_H_
#define MOESH_BASE_RANDOM_ID_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace moesh {

// `bytes` random bytes as 2 * `bytes` lowercase hex digits; INTERNAL if
// getrandom fails.
absl::StatusOr<std::string> RandomHexId(size_t bytes);

}  // namespace moesh

#endif  // MOESH_BASE_RANDOM_ID_H_
