// Throwaway certificates for a cluster on one machine (`moesh serve-local
// --tls`, the tests): a fresh CA and one certificate it signed, valid for a
// week, for every process to present as server and client on the internal
// plane (named moesh-internal, localhost, 127.0.0.1 and ::1). Made with the
// openssl command line; the CA's key stays in `dir` too.
#ifndef MOESH_CLI_LOCAL_CERTS_H_
#define MOESH_CLI_LOCAL_CERTS_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/rpc/internal_plane.h"

namespace moesh {

// Writes ca.crt, ca.key, tls.crt and tls.key into `dir` (created), replacing
// what is there; openssl's output goes to dir/openssl.log. UNAVAILABLE if
// openssl is missing or fails.
absl::StatusOr<TlsFiles> MakeLocalCertificates(const std::string& dir);

}  // namespace moesh

#endif  // MOESH_CLI_LOCAL_CERTS_H_
