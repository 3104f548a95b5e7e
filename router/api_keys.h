// API keys for the router's public planes (the HTTP API and moesh.v1.
// Generation): a request carries `Authorization: Bearer <key>` (an HTTP
// header, or the gRPC metadata `authorization`) and is refused without one of
// the keys. Keys come from a file, one per line (blank lines and lines
// starting with '#' skipped, surrounding whitespace trimmed): a Kubernetes
// Secret mounted as a file works as it is. Immutable after Load; thread-safe.
#ifndef MOESH_ROUTER_API_KEYS_H_
#define MOESH_ROUTER_API_KEYS_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moesh {

class ApiKeys {
 public:
  // The keys in `path`; NOT_FOUND when it cannot be read, INVALID_ARGUMENT
  // when it holds no key.
  static absl::StatusOr<std::unique_ptr<ApiKeys>> Load(const std::string& path);
  // From keys in memory (tests). REQUIRES: none empty.
  explicit ApiKeys(std::vector<std::string> keys) : keys_(std::move(keys)) {}

  // OK iff `authorization` (the header's value) is "Bearer <one of the
  // keys>"; UNAUTHENTICATED saying what is missing otherwise. The comparison
  // takes the same time wherever a key first differs.
  absl::Status Check(absl::string_view authorization) const;

 private:
  const std::vector<std::string> keys_;
};

// Whether `listen` (a --listen or --http_listen address: "host:port",
// "[v6]:port", civetweb's bare "port", or a comma-separated list of these)
// binds the loopback only: localhost, 127.0.0.0/8 or ::1. A bare port, an
// empty host, 0.0.0.0, :: or any other address or name binds beyond it.
bool IsLoopbackListen(absl::string_view listen);

// The one line a router logs at startup when `keys` is null and a public
// listener binds beyond the loopback (`listeners`: each one's flag and
// address; an empty address is no listener): anyone who reaches it may
// generate. Empty when there is nothing to warn about.
std::string MissingApiKeysWarning(
    const ApiKeys* keys, const std::vector<std::pair<std::string, std::string>>& listeners);

}  // namespace moesh

#endif  // MOESH_ROUTER_API_KEYS_H_
