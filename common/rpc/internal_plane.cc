#include "common/rpc/internal_plane.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/file_util.h"
#include "base/status.h"
#include "common/rpc/grpc_util.h"

namespace moesh {
namespace {

struct Plane {
  absl::Mutex mu;
  bool tls ABSL_GUARDED_BY(mu) = false;
  std::string cert_pem ABSL_GUARDED_BY(mu);
  std::string key_pem ABSL_GUARDED_BY(mu);
  std::string ca_pem ABSL_GUARDED_BY(mu);
  int max_receive_message_mb ABSL_GUARDED_BY(mu) = kDefaultMaxReceiveMessageMb;
};

Plane& ThePlane() {
  static Plane* plane = new Plane;  // never destroyed: channels may outlive main
  return *plane;
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  absl::StatusOr<std::string> pem = ReadFileToString(path);
  if (!pem.ok()) {
    return absl::Status(pem.status().code(),
                        absl::StrCat("--", flag, " ", path, ": ", pem.status().message()));
  }
  if (pem->find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", path, ": not PEM"));
  }
  return pem;
}

}  // namespace

absl::Status ValidateTlsFiles(const TlsFiles& files, const std::string& flag_prefix) {
  if (!files.enabled()) return absl::OkStatus();
  if (files.cert.empty() || files.key.empty() || files.ca.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag_prefix, "cert, ", flag_prefix, "key and ", flag_prefix,
                     "ca go together (", flag_prefix, "cert=", files.cert, ", ", flag_prefix,
                     "key=", files.key, ", ", flag_prefix, "ca=", files.ca, ")"));
  }
  return absl::OkStatus();
}

absl::Status ConfigureInternalPlane(const TlsFiles& files, int max_receive_message_mb) {
  RETURN_IF_ERROR(ValidateTlsFiles(files, "--tls_"));
  if (max_receive_message_mb < 1 || max_receive_message_mb > kMaxReceiveMessageMbLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("the largest message to receive must lie in [1, ", kMaxReceiveMessageMbLimit,
                     "] MiB, got ", max_receive_message_mb));
  }
  std::string cert, key, ca;
  if (files.enabled()) {
    ASSIGN_OR_RETURN(cert, ReadPem(files.cert, "tls_cert"));
    ASSIGN_OR_RETURN(key, ReadPem(files.key, "tls_key"));
    ASSIGN_OR_RETURN(ca, ReadPem(files.ca, "tls_ca"));
  }
  Plane& p = ThePlane();
  absl::MutexLock lock(&p.mu);
  p.tls = files.enabled();
  p.cert_pem = std::move(cert);
  p.key_pem = std::move(key);
  p.ca_pem = std::move(ca);
  p.max_receive_message_mb = max_receive_message_mb;
  return absl::OkStatus();
}

bool InternalTlsEnabled() {
  Plane& p = ThePlane();
  absl::MutexLock lock(&p.mu);
  return p.tls;
}

std::shared_ptr<grpc::ServerCredentials> InternalServerCredentials() {
  Plane& p = ThePlane();
  absl::MutexLock lock(&p.mu);
  if (!p.tls) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = p.ca_pem;
  ssl.pem_key_cert_pairs.push_back({p.key_pem, p.cert_pem});
  return grpc::SslServerCredentials(ssl);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PublicServerCredentials(bool tls) {
  Plane& p = ThePlane();
  absl::MutexLock lock(&p.mu);
  if (!tls) return grpc::InsecureServerCredentials();
  if (!p.tls) {
    return absl::FailedPreconditionError(
        "TLS on the public port needs a certificate: set --tls_cert, --tls_key and --tls_ca");
  }
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({p.key_pem, p.cert_pem});
  return grpc::SslServerCredentials(ssl);
}

grpc::ChannelArguments InternalChannelArgs() {
  Plane& p = ThePlane();
  absl::MutexLock lock(&p.mu);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(p.max_receive_message_mb << 20);
  args.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  if (p.tls) args.SetSslTargetNameOverride(kInternalTlsServerName);
  return args;
}

std::shared_ptr<grpc::Channel> CreateInternalChannel(const std::string& address) {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  {
    Plane& p = ThePlane();
    absl::MutexLock lock(&p.mu);
    if (p.tls) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = p.ca_pem;
      ssl.pem_private_key = p.key_pem;
      ssl.pem_cert_chain = p.cert_pem;
      credentials = grpc::SslCredentials(ssl);
    } else {
      credentials = grpc::InsecureChannelCredentials();
    }
  }
  return grpc::CreateCustomChannel(address, credentials, InternalChannelArgs());
}

absl::Status CheckAuthenticatedPeer(const grpc::ServerContextBase& context,
                                    const std::string& what) {
  if (!InternalTlsEnabled()) return absl::OkStatus();
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) return absl::OkStatus();
  return absl::PermissionDeniedError(
      absl::StrCat(what, " needs a peer with a client certificate signed by the cluster's CA"));
}

}  // namespace moesh
