// Small pieces the service mains use: expert lists, ready files, signals.
#ifndef MOESH_COMMON_SERVICE_WORKER_UTIL_H_
#define MOESH_COMMON_SERVICE_WORKER_UTIL_H_

#include <set>
#include <string>

#include "absl/status/statusor.h"

namespace moesh {

// "0-3,6" -> {0,1,2,3,6}; INVALID_ARGUMENT on malformed ranges or ids outside
// [0, num_experts).
absl::StatusOr<std::set<int>> ParseExpertList(const std::string& spec, int num_experts);
// "i/n" -> the i-th of n contiguous, near-equal shards of [0, num_experts).
absl::StatusOr<std::set<int>> ExpertShard(const std::string& spec, int num_experts);

// Writes "<grpc host:port>\n<metrics host:port>\n" and, where given, the
// router's "<internal host:port>\n" and "<http host:port>\n" (a line each
// in that order, the internal one empty when only http is given) atomically
// (tmp + rename) so a supervisor polling for the file never reads a partial
// address.
absl::Status WriteReadyFile(const std::string& path, const std::string& address,
                            const std::string& metrics_address,
                            const std::string& internal_address = "",
                            const std::string& http_address = "");

// Blocks SIGINT and SIGTERM in the calling thread, and so in every thread it
// starts afterwards: call first in main, so that only WaitForShutdownSignal
// ever takes them (a thread that did not block them would take one with the
// default action, ending the process without a drain).
void BlockShutdownSignals();
// Blocks until SIGINT or SIGTERM. Call from main after the servers started.
// Afterwards the calling thread takes them again with the default action: a
// second signal (during a drain) ends the process at once.
void WaitForShutdownSignal();

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_WORKER_UTIL_H_
