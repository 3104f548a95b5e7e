// absl::Status <-> grpc::Status at the service edge, and server setup shared
// by every moesh service (health checking, reflection, message limits).
#ifndef MOESH_COMMON_RPC_GRPC_UTIL_H_
#define MOESH_COMMON_RPC_GRPC_UTIL_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moesh {

grpc::Status ToGrpcStatus(const absl::Status& s);
absl::Status FromGrpcStatus(const grpc::Status& s);

// A started gRPC server with grpc.health.v1 and reflection enabled.
struct RunningServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port (resolves ":0")
};

// The largest message a server accepts unless told otherwise (ServerOptions'
// --max_receive_message_mb; its one definition).
constexpr int kDefaultMaxReceiveMessageMb = 256;
// gRPC counts message sizes in an int.
constexpr int kMaxReceiveMessageMbLimit = 2047;

// Binds `address` (host:port; port 0 picks a free one) on one listening
// socket (no SO_REUSEPORT: gRPC would clone the listener of a ":0" port onto
// a second, random port, and another process could bind the same port),
// registers `services` (borrowed; must outlive the server), starts it, and
// marks it SERVING. Messages larger than `max_receive_message_mb` MiB are
// refused (RESOURCE_EXHAUSTED). `credentials` null: the internal plane's
// (common/rpc/internal_plane.h: mutual TLS when configured). UNAVAILABLE if
// the address cannot be bound.
// REQUIRES: 1 <= max_receive_message_mb <= kMaxReceiveMessageMbLimit.
absl::StatusOr<RunningServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    int max_receive_message_mb = kDefaultMaxReceiveMessageMb,
    std::shared_ptr<grpc::ServerCredentials> credentials = nullptr);

// The caller's host as gRPC names it, without its port ("ipv4:10.0.0.7",
// "ipv6:[::1]"): one identity for every connection a peer opens.
std::string PeerHost(const grpc::ServerContextBase& context);

}  // namespace moesh

#endif  // MOESH_COMMON_RPC_GRPC_UTIL_H_
