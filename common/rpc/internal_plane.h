// The internal plane's transport security and limits: every gRPC server a
// moesh service runs and every channel between moesh services (registration
// and heartbeats, the router's calls to workers, expert dispatches, KV
// handoffs, the device transports' side channels) take their credentials and
// message limit from here.
//
// Process-wide: a service's main calls ConfigureInternalPlane once, before it
// starts a server or opens a channel; until then (tests, tools) the plane is
// plaintext with the default message limit. Thread-safe.
//
// With TLS every internal listener requires a client certificate signed by
// the CA (mutual TLS: a peer without one cannot connect, so every call that
// reaches a handler comes from a holder of the cluster's certificates), and
// every channel presents this process's certificate and checks the server's
// against the CA. Peers are not told apart by host name (pods come and go
// with new addresses): a server certificate must name kInternalTlsServerName
// (a DNS subject alternative name), which every channel expects.
#ifndef MOESH_COMMON_RPC_INTERNAL_PLANE_H_
#define MOESH_COMMON_RPC_INTERNAL_PLANE_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace moesh {

// The name every internal server certificate carries (subjectAltName DNS).
inline constexpr char kInternalTlsServerName[] = "moesh-internal";

// Certificate files (PEM). All three empty: plaintext; otherwise all three set.
struct TlsFiles {
  std::string cert;  // this process's certificate (chain), server and client
  std::string key;   // its private key
  std::string ca;    // the CA peers' certificates must be signed by
  // The files are read again every reload_s seconds (a rotated certificate
  // or CA takes effect on the next handshake, no restart); 0: read once.
  int reload_s = 60;
  bool enabled() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// INVALID_ARGUMENT unless the three paths are all empty or all set
// (`flag_prefix` names them in the message: "--tls_").
absl::Status ValidateTlsFiles(const TlsFiles& files, const std::string& flag_prefix);

// Reads the certificate files (NOT_FOUND / INVALID_ARGUMENT naming the file;
// later re-reads that fail keep the last good ones, logged by gRPC) and sets
// the plane's message limit: channels receive messages up to
// `max_receive_message_mb` MiB, as the service's listeners do.
// REQUIRES: 1 <= max_receive_message_mb <= kMaxReceiveMessageMbLimit.
absl::Status ConfigureInternalPlane(const TlsFiles& files, int max_receive_message_mb);

// Whether ConfigureInternalPlane turned TLS on.
bool InternalTlsEnabled();

// Credentials of an internal listener: mutual TLS, or insecure.
std::shared_ptr<grpc::ServerCredentials> InternalServerCredentials();
// Credentials of a public listener with `tls`: the plane's certificate,
// no client certificate asked for; insecure without TLS configured.
// FAILED_PRECONDITION when `tls` but the plane has no certificate.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PublicServerCredentials(bool tls);

// Channel arguments of an internal channel: the plane's receive limit, a send
// limit as large as gRPC allows, and the expected server name under TLS.
grpc::ChannelArguments InternalChannelArgs();
// A channel to another moesh service at `address` (host:port).
std::shared_ptr<grpc::Channel> CreateInternalChannel(const std::string& address);

// OK iff the plane is plaintext or the caller presented a certificate the CA
// signed; else PERMISSION_DENIED naming `what`. Handlers of calls that change
// state (registration, placement, reservations) check it, so a listener
// misconfigured without client verification still refuses them.
absl::Status CheckAuthenticatedPeer(const grpc::ServerContextBase& context,
                                    const std::string& what);

}  // namespace moesh

#endif  // MOESH_COMMON_RPC_INTERNAL_PLANE_H_
