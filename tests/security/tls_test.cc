// The internal plane under mutual TLS (issue 21), against real processes: a
// cluster whose every process holds a certificate of a throwaway CA
// (MakeLocalCertificates, as `moesh serve-local --tls`) serves a request end
// to end over a TLS public port, while its internal ports refuse a plaintext
// client, a client without a certificate and one whose certificate another
// CA signed; and a flood of decode reservations from one peer leaves room
// for everyone else (--max_pending_kv_share).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "cli/local_certs.h"
#include "cli/local_cluster.h"
#include "common/model/config.h"
#include "common/model/random_checkpoint.h"
#include "common/rpc/internal_plane.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "moesh/v1/generation.grpc.pb.h"
#include "moesh/v1/worker.grpc.pb.h"
#include "tests/security/lsan_grpc_openssl.h"
#include "tests/security/moesh_complete.h"

namespace moesh {
namespace {

using std::chrono::seconds;

// How a test client connects.
enum class Client {
  kPlaintext,
  kNoCertificate,  // TLS, trusting the cluster's CA, presenting no certificate
  kWrongCa,        // TLS, trusting the cluster's CA, presenting another CA's certificate
  kCluster,        // TLS with the cluster's own certificate
};

std::string Pem(const std::string& path) {
  absl::StatusOr<std::string> pem = ReadFileToString(path);
  EXPECT_TRUE(pem.ok()) << pem.status();
  return pem.ok() ? *pem : "";
}

std::unique_ptr<grpc::ClientContext> Deadline(seconds d) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + d);
  return ctx;
}

// The suite's cluster and certificates.
struct TlsCluster {
  TlsFiles certs;  // the cluster's CA and certificate
  TlsFiles wrong;  // another CA's
  std::unique_ptr<LocalCluster> cluster;

  const LocalCluster::Process& Proc(const std::string& name) const {
    static const LocalCluster::Process none;
    const auto& all = cluster->processes();
    auto it = std::find_if(all.begin(), all.end(), [&](const auto& p) { return p.name == name; });
    return it == all.end() ? none : *it;
  }
};

class InternalPlaneTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string root = JoinPath(::testing::TempDir(), "tls_test");
    std::filesystem::remove_all(root);
    std::filesystem::create_directories(root);
    const std::string model_dir = JoinPath(root, "model");
    absl::StatusOr<ModelConfig> c = PresetConfig("v3", "tiny");
    ASSERT_TRUE(c.ok());
    RandomCheckpointOptions opt;
    opt.seed = 21;
    ASSERT_TRUE(WriteRandomCheckpoint(*c, model_dir, opt).ok());
    auto t = std::make_unique<TlsCluster>();
    absl::StatusOr<TlsFiles> certs = MakeLocalCertificates(JoinPath(root, "certs"));
    ASSERT_TRUE(certs.ok()) << certs.status();
    absl::StatusOr<TlsFiles> wrong = MakeLocalCertificates(JoinPath(root, "other-ca"));
    ASSERT_TRUE(wrong.ok()) << wrong.status();
    t->certs = *certs;
    t->wrong = *wrong;
    LocalClusterOptions o;
    o.model_dir = model_dir;
    o.bin_dir = MOESH_BINARY_DIR;
    o.work_dir = JoinPath(root, "cluster");
    o.tls = t->certs;
    o.router.public_tls = true;
    // Dual stack: the router reaches the decode worker as 127.0.0.1, a second
    // peer host on this machine as ::1.
    o.decode.server.listen = "[::]:0";
    o.decode.max_pending_kv_share = 0.5;
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    t->cluster = std::move(*cluster);
    t_ = t.release();
  }
  static void TearDownTestSuite() {
    delete t_;
    t_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(t_, nullptr); }

  // A channel to an internal port as `client`.
  static std::shared_ptr<grpc::Channel> InternalChannel(const std::string& address, Client client) {
    if (client == Client::kPlaintext) {
      return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = Pem(t_->certs.ca);
    if (client != Client::kNoCertificate) {
      const TlsFiles& mine = client == Client::kWrongCa ? t_->wrong : t_->certs;
      ssl.pem_private_key = Pem(mine.key);
      ssl.pem_cert_chain = Pem(mine.cert);
    }
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride(kInternalTlsServerName);
    return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
  }

  // grpc.health.v1 Check on `address` as `client`.
  static grpc::Status Health(const std::string& address, Client client) {
    auto stub = grpc::health::v1::Health::NewStub(InternalChannel(address, client));
    grpc::health::v1::HealthCheckResponse resp;
    return stub->Check(Deadline(seconds(5)).get(), grpc::health::v1::HealthCheckRequest(), &resp);
  }

  // A greedy request of 4 tokens to the TLS public port, checked against the CA.
  static grpc::Status Generate(int* tokens) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = Pem(t_->certs.ca);
    auto stub = v1::Generation::NewStub(
        grpc::CreateChannel(t_->cluster->router_address(), grpc::SslCredentials(ssl)));
    v1::GenerateRequest r;
    for (int32_t t : {5, 17, 300}) r.mutable_token_ids()->add_ids(t);
    r.mutable_stop()->set_max_new_tokens(4);
    r.mutable_stop()->set_ignore_eos(true);
    auto ctx = Deadline(seconds(60));
    auto reader = stub->Generate(ctx.get(), r);
    v1::GenerateResponse m;
    *tokens = 0;
    while (reader->Read(&m)) *tokens += m.token_ids_size();
    return reader->Finish();
  }

  static TlsCluster* t_;
};

TlsCluster* InternalPlaneTest::t_ = nullptr;

TEST_F(InternalPlaneTest, ServesEndToEndOverTls) {
  int tokens = 0;
  const grpc::Status s = Generate(&tokens);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(tokens, 4);
  // The public port speaks TLS only.
  auto plain = v1::Generation::NewStub(
      grpc::CreateChannel(t_->cluster->router_address(), grpc::InsecureChannelCredentials()));
  v1::GenerateRequest r;
  r.mutable_token_ids()->add_ids(5);
  auto ctx = Deadline(seconds(5));
  auto reader = plain->Generate(ctx.get(), r);
  v1::GenerateResponse m;
  EXPECT_FALSE(reader->Read(&m));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

// The CLI reaches a --public_tls router with --server_ca, and only with the
// CA that signed the router's certificate.
TEST_F(InternalPlaneTest, CompleteSpeaksTlsWithServerCa) {
  const std::string router = t_->cluster->router_address();
  const std::string request = "--prompt_ids=5,17,300 --max_new_tokens=4 --ignore_eos --json";
  auto [rc, out] = MoeshComplete(router, absl::StrCat("--server_ca=", t_->certs.ca, " ", request));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"completion_tokens\":4"), std::string::npos) << out;
  std::tie(rc, out) = MoeshComplete(router, absl::StrCat("--timeout=5 ", request));  // plaintext
  EXPECT_NE(rc, 0) << out;
  std::tie(rc, out) =
      MoeshComplete(router, absl::StrCat("--timeout=5 --server_ca=", t_->wrong.ca, " ", request));
  EXPECT_NE(rc, 0) << out;
  std::tie(rc, out) = MoeshComplete(router, absl::StrCat("--server_ca=/nonexistent.pem ", request));
  EXPECT_NE(rc, 0) << out;
  EXPECT_NE(out.find("--server_ca"), std::string::npos) << out;
}

TEST_F(InternalPlaneTest, InternalPortsRefusePeersWithoutTheClustersCertificate) {
  std::vector<std::string> ports = {t_->cluster->router_internal_address()};
  for (const char* name : {"prefill-0", "decode-0", "expert-0", "expert-1"}) {
    ASSERT_FALSE(t_->Proc(name).address.empty()) << name;
    ports.push_back(t_->Proc(name).address);
  }
  for (const std::string& address : ports) {
    SCOPED_TRACE(address);
    const grpc::Status ok = Health(address, Client::kCluster);
    EXPECT_TRUE(ok.ok()) << ok.error_message();
    for (Client bad : {Client::kPlaintext, Client::kNoCertificate, Client::kWrongCa}) {
      const grpc::Status s = Health(address, bad);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE)
          << static_cast<int>(bad) << ": " << s.error_message();
    }
  }
  // A plaintext registration never reaches the router's handler.
  auto cluster = v1::Cluster::NewStub(
      InternalChannel(t_->cluster->router_internal_address(), Client::kPlaintext));
  v1::DeregisterRequest req;
  req.set_worker_id("DECODE-0");
  v1::DeregisterResponse resp;
  EXPECT_EQ(cluster->Deregister(Deadline(seconds(5)).get(), req, &resp).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  int tokens = 0;
  EXPECT_TRUE(Generate(&tokens).ok());
}

// 200 reservations of 256-token prompts (4 KV blocks each) from ::1 (a peer
// holding the cluster's certificate) would take the decode worker's 512
// blocks; the per-peer cap
// (--max_pending_kv_share 0.5) stops them at 256, and the router, another
// peer, still gets its requests served while they are held.
TEST_F(InternalPlaneTest, ReservationFloodFromOnePeerLeavesRoomForOthers) {
  const std::string& decode = t_->Proc("decode-0").address;
  const std::string port = decode.substr(decode.rfind(':') + 1);
  auto stub = v1::DecodeWorker::NewStub(InternalChannel("[::1]:" + port, Client::kCluster));
  struct Held {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReader<v1::DecodeResponse>> reader;
  };
  std::vector<Held> held;
  int reserved = 0, capped = 0;
  std::string message;
  for (int i = 0; i < 200; ++i) {
    v1::DecodeRequest r;
    r.set_request_id(absl::StrCat("flood-", i));
    for (int t = 0; t < 256; ++t) r.add_prompt_ids(2 + t % 400);  // 4 blocks of 64
    r.set_max_new_tokens(16);
    Held h;
    h.ctx = Deadline(seconds(60));
    h.reader = stub->Decode(h.ctx.get(), r);
    v1::DecodeResponse m;
    if (h.reader->Read(&m)) {
      ASSERT_TRUE(m.reserved());
      ++reserved;
      held.push_back(std::move(h));
      continue;
    }
    const grpc::Status s = h.reader->Finish();
    ASSERT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
    ++capped;
    message = s.error_message();
  }
  EXPECT_EQ(reserved, 64);
  EXPECT_EQ(capped, 136);
  EXPECT_NE(message.find("--max_pending_kv_share"), std::string::npos) << message;
  // Another peer (the router, over 127.0.0.1) is served while the flood holds its leases.
  for (int i = 0; i < 3; ++i) {
    int tokens = 0;
    const grpc::Status s = Generate(&tokens);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(tokens, 4);
  }
  for (Held& h : held) h.ctx->TryCancel();
  for (Held& h : held) {
    v1::DecodeResponse m;
    while (h.reader->Read(&m)) {
    }
    h.reader->Finish();
  }
}

}  // namespace
}  // namespace moesh
