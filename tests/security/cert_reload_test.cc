// Certificate rotation on the internal plane (issue 21): the plane re-reads
// its certificate files every --tls_reload_s seconds, so a renewed
// certificate and CA (a Kubernetes secret updated in place) take effect on
// the next handshake without a restart. In one process: a server on the
// plane's credentials, then the files are replaced with another CA's; a new
// internal channel reaches the server (both sides reloaded), and a client
// that still trusts only the old CA no longer does (the server now presents
// the new certificate).
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "base/file_util.h"
#include "cli/local_certs.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/security/lsan_grpc_openssl.h"

namespace moesh {
namespace {

namespace fs = std::filesystem;

// Health.Check over `channel` within two seconds.
grpc::Status Check(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  return stub->Check(&ctx, req, &resp);
}

// A channel that trusts only `files.ca` and presents `files`' certificate:
// a peer still holding the certificates of before a rotation.
std::shared_ptr<grpc::Channel> PinnedChannel(const std::string& address, const TlsFiles& files) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = *ReadFileToString(files.ca);
  ssl.pem_private_key = *ReadFileToString(files.key);
  ssl.pem_cert_chain = *ReadFileToString(files.cert);
  grpc::ChannelArguments args;
  args.SetSslTargetNameOverride(kInternalTlsServerName);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

// Replaces `to`'s three files with `from`'s, each by an atomic rename.
void Install(const TlsFiles& from, const TlsFiles& to) {
  for (auto [src, dst] : {std::pair{from.cert, to.cert}, {from.key, to.key}, {from.ca, to.ca}}) {
    fs::copy_file(src, dst + ".new", fs::copy_options::overwrite_existing);
    fs::rename(dst + ".new", dst);
  }
}

TEST(CertReloadTest, RotatedCertificatesTakeEffectWithoutRestart) {
  const fs::path dir = fs::path(::testing::TempDir()) / "cert_reload";
  fs::remove_all(dir);
  fs::create_directories(dir);
  absl::StatusOr<TlsFiles> old_ca = MakeLocalCertificates((dir / "old").string());
  absl::StatusOr<TlsFiles> new_ca = MakeLocalCertificates((dir / "new").string());
  ASSERT_TRUE(old_ca.ok()) << old_ca.status();
  ASSERT_TRUE(new_ca.ok()) << new_ca.status();
  TlsFiles live{(dir / "tls.crt").string(), (dir / "tls.key").string(), (dir / "ca.crt").string(),
                /*reload_s=*/1};
  Install(*old_ca, live);
  ASSERT_TRUE(ConfigureInternalPlane(live, kDefaultMaxReceiveMessageMb).ok());

  absl::StatusOr<RunningServer> server =
      StartGrpcServer("127.0.0.1:0", {}, kDefaultMaxReceiveMessageMb);  // the plane's credentials
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = "127.0.0.1:" + std::to_string(server->port);

  grpc::Status s = Check(CreateInternalChannel(address));
  EXPECT_TRUE(s.ok()) << "before the rotation: " << s.error_message();
  s = Check(PinnedChannel(address, *old_ca));
  EXPECT_TRUE(s.ok()) << "a peer with the old certificates, before the rotation: "
                      << s.error_message();

  Install(*new_ca, live);
  // The provider polls every second; allow a few polls.
  grpc::Status pinned = grpc::Status::OK;
  for (int i = 0; i < 50 && pinned.ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    pinned = Check(PinnedChannel(address, *old_ca));
  }
  EXPECT_FALSE(pinned.ok()) << "the server still presents the old CA's certificate 10 s after "
                               "the files changed";
  s = Check(CreateInternalChannel(address));
  EXPECT_TRUE(s.ok()) << "after the rotation, a new internal channel: " << s.error_message();
  server->server->Shutdown();
  ASSERT_TRUE(ConfigureInternalPlane(TlsFiles(), kDefaultMaxReceiveMessageMb).ok());
}

TEST(CertReloadTest, NegativeReloadIntervalIsRefused) {
  TlsFiles files{"a.crt", "a.key", "ca.crt", -1};
  EXPECT_EQ(ConfigureInternalPlane(files, kDefaultMaxReceiveMessageMb).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moesh
