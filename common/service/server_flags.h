// The flags every service binary has (router, prefill, decode and expert
// workers): the model it serves, where it listens and the largest message it
// takes there, its ready file and its /metrics endpoint.
#ifndef MOESH_COMMON_SERVICE_SERVER_FLAGS_H_
#define MOESH_COMMON_SERVICE_SERVER_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"

namespace moesh {

// The defaults are the flags' defaults (server_flags.cc).
struct ServerOptions {
  std::string model;                           // --model: the model directory
  std::string listen = "127.0.0.1:0";          // --listen: gRPC host:port (port 0: any free one)
  std::string ready_file;                      // --ready_file (empty: none)
  std::string metrics_listen = "127.0.0.1:0";  // --metrics_listen (empty: no /metrics)
  // --max_receive_message_mb: the largest gRPC message the listener accepts,
  // in MiB, [1, kMaxReceiveMessageMbLimit].
  int max_receive_message_mb = kDefaultMaxReceiveMessageMb;
  int drain_timeout_s = 30;  // --drain_timeout_s: graceful shutdown's bound (0: none)
  // --tls_cert, --tls_key, --tls_ca: mutual TLS on the internal plane (every
  // listener and every channel to another service; common/rpc/internal_plane.h).
  TlsFiles tls;
};

// --model, --listen, --ready_file, --metrics_listen, --max_receive_message_mb,
// --drain_timeout_s, --tls_{cert,key,ca}; INVALID_ARGUMENT without --model,
// with a message size out of range, a negative drain timeout or some but not
// all of the TLS files.
absl::StatusOr<ServerOptions> ServerOptionsFromFlags();
// Sets up the process's internal plane from `o` (ConfigureInternalPlane: its
// certificates, its channels' message limit); a service's main calls it
// before it serves or connects.
absl::Status ConfigureInternalPlane(const ServerOptions& o);
// The flags that set `o` (flag_args.cc).
void AppendArgs(const ServerOptions& o, std::vector<std::string>* args);

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_SERVER_FLAGS_H_
