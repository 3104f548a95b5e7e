// The internal plane's settings: the message limit its channels receive
// under, and the certificate files' checks (mutual TLS itself runs against
// real processes in tests/security/tls_test).
#include "common/rpc/internal_plane.h"

#include <grpcpp/grpcpp.h>

#include <string>

#include "common/rpc/grpc_util.h"
#include "gtest/gtest.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {
namespace {

// Answers Info with a fingerprint of `bytes` bytes.
class BigAnswers final : public v1::ExpertWorker::Service {
 public:
  explicit BigAnswers(size_t bytes) : bytes_(bytes) {}
  grpc::Status Info(grpc::ServerContext*, const v1::ExpertInfoRequest*,
                    v1::ExpertInfoResponse* response) override {
    response->set_model_fingerprint(std::string(bytes_, 'f'));
    return grpc::Status::OK;
  }

 private:
  const size_t bytes_;
};

grpc::Status CallInfo(const std::string& address) {
  auto stub = v1::ExpertWorker::NewStub(CreateInternalChannel(address));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ExpertInfoResponse response;
  return stub->Info(&ctx, v1::ExpertInfoRequest(), &response);
}

TEST(InternalPlaneTest, ChannelsReceiveUpToThePlanesLimit) {
  BigAnswers service(3 << 20);  // 3 MiB
  absl::StatusOr<RunningServer> server = StartGrpcServer("127.0.0.1:0", {&service});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = "127.0.0.1:" + std::to_string(server->port);
  ASSERT_TRUE(ConfigureInternalPlane(TlsFiles(), 2).ok());
  const grpc::Status refused = CallInfo(address);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  ASSERT_TRUE(ConfigureInternalPlane(TlsFiles(), 4).ok());
  const grpc::Status ok = CallInfo(address);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
  EXPECT_FALSE(InternalTlsEnabled());
  ASSERT_TRUE(ConfigureInternalPlane(TlsFiles(), kDefaultMaxReceiveMessageMb).ok());
  server->server->Shutdown();
}

TEST(InternalPlaneTest, CertificateFilesAreCheckedTogether) {
  EXPECT_TRUE(ValidateTlsFiles(TlsFiles(), "--tls_").ok());
  const absl::Status partial = ValidateTlsFiles({"a.crt", "", "ca.crt"}, "--tls_");
  EXPECT_EQ(partial.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(partial.message().find("--tls_key"), std::string::npos) << partial;
  const absl::Status missing =
      ConfigureInternalPlane({"/nonexistent/tls.crt", "/nonexistent/tls.key", "/x/ca.crt"}, 4);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find("--tls_cert /nonexistent/tls.crt"), std::string::npos)
      << missing;
  EXPECT_EQ(ConfigureInternalPlane(TlsFiles(), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(InternalTlsEnabled());  // a failed configuration changes nothing
  EXPECT_FALSE(PublicServerCredentials(true).ok());
}

}  // namespace
}  // namespace moesh
