#include "common/rpc/internal_plane.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/file_util.h"
#include "base/status.h"
#include "common/rpc/grpc_util.h"

namespace moesh {
namespace {

namespace tls = grpc::experimental;

struct Plane {
  absl::Mutex mu;
  // The certificates every credential of the plane watches; null: plaintext.
  std::shared_ptr<tls::CertificateProviderInterface> certs ABSL_GUARDED_BY(mu);
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
  if (files.reload_s < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_reload_s must be >= 0, got ", files.reload_s));
  }
  std::shared_ptr<tls::CertificateProviderInterface> certs;
  if (files.enabled()) {
    // Read once here so that a missing or malformed file fails the start.
    ASSIGN_OR_RETURN(std::string cert, ReadPem(files.cert, "tls_cert"));
    ASSIGN_OR_RETURN(std::string key, ReadPem(files.key, "tls_key"));
    ASSIGN_OR_RETURN(std::string ca, ReadPem(files.ca, "tls_ca"));
    if (files.reload_s > 0) {
      certs = std::make_shared<tls::FileWatcherCertificateProvider>(files.key, files.cert, files.ca,
                                                                    files.reload_s);
    } else {
      certs = std::make_shared<tls::StaticDataCertificateProvider>(
          ca, std::vector<tls::IdentityKeyCertPair>{{key, cert}});
    }
  }
  Plane& p = ThePlane();
  absl::MutexLock lock(&p.mu);
  p.certs = std::move(certs);
  p.max_receive_message_mb = max_receive_message_mb;
  return absl::OkStatus();
}

bool InternalTlsEnabled() {
  Plane& p = ThePlane();
  absl::MutexLock lock(&p.mu);
  return p.certs != nullptr;
}

std::shared_ptr<grpc::ServerCredentials> InternalServerCredentials() {
  Plane& p = ThePlane();
  absl::MutexLock lock(&p.mu);
  if (p.certs == nullptr) return grpc::InsecureServerCredentials();
  tls::TlsServerCredentialsOptions options(p.certs);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return tls::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PublicServerCredentials(bool tls) {
  Plane& p = ThePlane();
  absl::MutexLock lock(&p.mu);
  if (!tls) return grpc::InsecureServerCredentials();
  if (p.certs == nullptr) {
    return absl::FailedPreconditionError(
        "TLS on the public port needs a certificate: set --tls_cert, --tls_key and --tls_ca");
  }
  tls::TlsServerCredentialsOptions options(p.certs);
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  return tls::TlsServerCredentials(options);
}

grpc::ChannelArguments InternalChannelArgs() {
  Plane& p = ThePlane();
  absl::MutexLock lock(&p.mu);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(p.max_receive_message_mb << 20);
  args.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  if (p.certs != nullptr) args.SetSslTargetNameOverride(kInternalTlsServerName);
  return args;
}

std::shared_ptr<grpc::Channel> CreateInternalChannel(const std::string& address) {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  {
    Plane& p = ThePlane();
    absl::MutexLock lock(&p.mu);
    if (p.certs != nullptr) {
      tls::TlsChannelCredentialsOptions options;
      options.set_certificate_provider(p.certs);
      options.watch_root_certs();
      options.watch_identity_key_cert_pairs();
      // The server's certificate must name kInternalTlsServerName (the
      // target name override of InternalChannelArgs).
      options.set_certificate_verifier(std::make_shared<tls::HostNameCertificateVerifier>());
      credentials = tls::TlsCredentials(options);
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
