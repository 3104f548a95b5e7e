// The control plane against a hostile or buggy peer (issue 21), replayed
// against real processes (LocalCluster: a router, two expert workers, a
// prefill and a decode worker on loopback): each attack the black-box test
// found, and the defended outcome — a refusal naming the field, and a
// cluster that keeps serving everyone else.
#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "cli/local_cluster.h"
#include "common/model/config.h"
#include "common/model/random_checkpoint.h"
#include "common/rpc/grpc_util.h"
#include "common/tokenizer/embedded_tokenizers.h"
#include "gtest/gtest.h"
#include "moesh/v1/generation.grpc.pb.h"
#include "moesh/v1/worker.grpc.pb.h"
#include "tests/security/moesh_complete.h"

namespace moesh {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// The router takes messages up to this many MiB here (the default is 256).
constexpr int kRouterMessageMb = 4;

template <typename T>
std::unique_ptr<typename T::Stub> StubTo(const std::string& address) {
  return T::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

std::unique_ptr<grpc::ClientContext> Deadline(seconds d) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + d);
  return ctx;
}

// A greedy request of `max_new` tokens; a text prompt when `text` is set.
grpc::Status Generate(const std::string& router, const std::string& text = "",
                      const std::string& request_id = "", int max_new = 4) {
  v1::GenerateRequest r;
  if (text.empty()) {
    for (int32_t t : {5, 17, 300}) r.mutable_token_ids()->add_ids(t);
  } else {
    r.set_text(text);
  }
  r.set_request_id(request_id);
  r.mutable_stop()->set_max_new_tokens(max_new);
  r.mutable_stop()->set_ignore_eos(true);
  auto ctx = Deadline(seconds(60));
  auto reader = StubTo<v1::Generation>(router)->Generate(ctx.get(), r);
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
  }
  return reader->Finish();
}

// INVALID_ARGUMENT (or `code`) whose message names `field`.
void ExpectRefused(const grpc::Status& s, const std::string& field,
                   grpc::StatusCode code = grpc::StatusCode::INVALID_ARGUMENT) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_NE(s.error_message().find(field), std::string::npos)
      << "\"" << s.error_message() << "\" does not name " << field;
}

// One cluster for the suite: a tiny V3 model with a tokenizer; the router's
// messages limited to kRouterMessageMb.
class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string root = JoinPath(::testing::TempDir(), "security_test");
    std::filesystem::remove_all(root);
    model_dir_ = new std::string(JoinPath(root, "model"));
    absl::StatusOr<ModelConfig> c = PresetConfig("v3", "tiny");
    ASSERT_TRUE(c.ok());
    RandomCheckpointOptions opt;
    opt.seed = 21;
    opt.tokenizer_json = std::string(*EmbeddedTokenizerJson("tiny"));
    ASSERT_TRUE(WriteRandomCheckpoint(*c, *model_dir_, opt).ok());
    fingerprint_ = new std::string(c->Fingerprint());
    LocalClusterOptions o;
    o.model_dir = *model_dir_;
    o.bin_dir = MOESH_BINARY_DIR;
    o.work_dir = JoinPath(root, "cluster");
    o.router.heartbeat_timeout_ms = 1500;
    o.router.server.max_receive_message_mb = kRouterMessageMb;
    absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete model_dir_;
    delete fingerprint_;
  }
  void SetUp() override { ASSERT_NE(cluster_, nullptr); }

  static const std::string& router() { return cluster_->router_address(); }
  // The router's internal plane (moesh.v1.Cluster).
  static std::string internal() { return cluster_->router_internal_address(); }
  static const LocalCluster::Process& Proc(const std::string& name) {
    for (const auto& p : cluster_->processes()) {
      if (p.name == name) return p;
    }
    static const LocalCluster::Process none;
    return none;
  }
  static grpc::Status Register(const v1::RegisterRequest& r, v1::RegisterResponse* resp) {
    return StubTo<v1::Cluster>(internal())->Register(Deadline(seconds(10)).get(), r, resp);
  }
  static grpc::Status Heartbeat(const v1::HeartbeatRequest& r) {
    v1::HeartbeatResponse resp;
    return StubTo<v1::Cluster>(internal())->Heartbeat(Deadline(seconds(10)).get(), r, &resp);
  }
  static grpc::Status Rebalance(int slots) {
    v1::RebalanceRequest r;
    r.set_slots_per_worker(slots);
    v1::RebalanceResponse resp;
    return StubTo<v1::Cluster>(internal())->Rebalance(Deadline(seconds(60)).get(), r, &resp);
  }
  // A registration of `kind` from `address` with the model's fingerprint.
  static v1::RegisterRequest Registration(v1::WorkerKind kind, const std::string& address) {
    v1::RegisterRequest r;
    r.set_kind(kind);
    r.set_address(address);
    r.set_model_fingerprint(*fingerprint_);
    return r;
  }
  // Ten requests, all served.
  static void ExpectServing() {
    for (int i = 0; i < 10; ++i) {
      const grpc::Status s = Generate(router());
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
  }

  static std::string* model_dir_;
  static std::string* fingerprint_;
  static LocalCluster* cluster_;
};

std::string* SecurityTest::model_dir_ = nullptr;
std::string* SecurityTest::fingerprint_ = nullptr;
LocalCluster* SecurityTest::cluster_ = nullptr;

// Items 1, 2, 4, 8: out-of-range expert ids (a SIGSEGV, an OOM), bad kinds
// and addresses, and insane slots are refused; the router keeps serving and
// rebalances as before.
TEST_F(SecurityTest, BadRegistrationsAndRebalancesAreRefused) {
  struct Case {
    const char* field;
    v1::RegisterRequest request;
  };
  std::vector<Case> cases;
  for (int id : {-3000000, 1000000000, 8}) {
    v1::RegisterRequest r = Registration(v1::WORKER_KIND_EXPERT, "127.0.0.1:5");
    r.add_expert_ids(id);
    cases.push_back({"expert_ids", r});
  }
  v1::RegisterRequest many = Registration(v1::WORKER_KIND_EXPERT, "127.0.0.1:5");
  for (int i = 0; i < 1000000; ++i) many.add_expert_ids(i % 8);
  cases.push_back({"expert_ids", many});
  cases.push_back({"kind", Registration(static_cast<v1::WorkerKind>(99), "127.0.0.1:5")});
  cases.push_back({"address", Registration(v1::WORKER_KIND_DECODE, "garbage::::")});
  v1::RegisterRequest dp = Registration(v1::WORKER_KIND_DECODE, "127.0.0.1:5");
  dp.set_data_plane_address("nowhere");
  cases.push_back({"data_plane_address", dp});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    v1::RegisterResponse resp;
    ExpectRefused(Register(c.request, &resp), c.field);
  }
  for (int slots : {-1, 2147483647, 9}) {
    SCOPED_TRACE(slots);
    const auto start = std::chrono::steady_clock::now();
    ExpectRefused(Rebalance(slots), "slots_per_worker");
    EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(5));
  }
  // The router is still up: it rebalances its real expert workers and serves.
  const grpc::Status s = Rebalance(0);
  EXPECT_TRUE(s.ok()) << s.error_message();
  ExpectServing();
}

// A fake worker's gRPC server that counts the calls it gets.
class FakeWorker final : public v1::PrefillWorker::Service, public v1::DecodeWorker::Service {
 public:
  grpc::Status Prefill(grpc::ServerContext*, const v1::PrefillRequest*,
                       v1::PrefillResponse*) override {
    ++calls;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake");
  }
  grpc::Status Decode(grpc::ServerContext*, const v1::DecodeRequest*,
                      grpc::ServerWriter<v1::DecodeResponse>*) override {
    ++calls;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake");
  }
  std::atomic<int> calls{0};
};

// Item 3: a worker lying about its load (kv_usage -1, queued_prompt_tokens
// -1) had every request; its heartbeats are refused now, so it is dropped
// as silent and captures nothing.
TEST_F(SecurityTest, LyingLoadsCaptureNoTraffic) {
  FakeWorker fake;
  absl::StatusOr<RunningServer> server =
      StartGrpcServer("127.0.0.1:0", {static_cast<v1::PrefillWorker::Service*>(&fake),
                                      static_cast<v1::DecodeWorker::Service*>(&fake)});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = absl::StrCat("127.0.0.1:", server->port);
  struct Lie {
    v1::WorkerKind kind;
    const char* field;
    std::function<void(v1::WorkerLoad*)> set;
  };
  const std::vector<Lie> lies = {
      {v1::WORKER_KIND_DECODE, "load.kv_usage", [](v1::WorkerLoad* l) { l->set_kv_usage(-1); }},
      {v1::WORKER_KIND_PREFILL, "load.queued_prompt_tokens",
       [](v1::WorkerLoad* l) { l->set_queued_prompt_tokens(-1); }},
  };
  for (const Lie& lie : lies) {
    SCOPED_TRACE(lie.field);
    v1::RegisterResponse reg;
    ASSERT_TRUE(Register(Registration(lie.kind, address), &reg).ok());
    v1::HeartbeatRequest hb;
    hb.set_worker_id(reg.worker_id());
    lie.set(hb.mutable_load());
    ExpectRefused(Heartbeat(hb), lie.field);
    // It keeps lying past the router's heartbeat timeout (1.5 s) ...
    std::atomic<bool> stop{false};
    std::thread liar([&] {
      while (!stop) {
        Heartbeat(hb);
        std::this_thread::sleep_for(milliseconds(100));
      }
    });
    std::this_thread::sleep_for(milliseconds(2500));
    // ... and gets none of the requests, which all succeed.
    ExpectServing();
    stop = true;
    liar.join();
    EXPECT_EQ(fake.calls.load(), 0);
  }
  server->server->Shutdown(std::chrono::system_clock::now());
}

// Item 5: worker ids are unguessable, so Deregister cannot be aimed.
TEST_F(SecurityTest, WorkerIdsAreUnguessable) {
  const std::regex id_form("(PREFILL|DECODE|EXPERT)-[0-9a-f]{32}");
  std::set<std::string> ids;
  for (const char* name : {"expert-0", "expert-1", "prefill-0", "decode-0"}) {
    absl::StatusOr<std::string> log = ReadFileToString(Proc(name).log_path);
    ASSERT_TRUE(log.ok());
    std::smatch m;
    const std::regex line("registered with router \\S+ as (\\S+)");
    ASSERT_TRUE(std::regex_search(*log, m, line)) << name;
    EXPECT_TRUE(std::regex_match(m[1].str(), id_form)) << m[1];
    ids.insert(m[1]);
  }
  EXPECT_EQ(ids.size(), 4u);
  // The guesses the old sequential ids invited hit nobody.
  for (const char* kind : {"PREFILL", "DECODE", "EXPERT"}) {
    for (int n = 0; n <= 8; ++n) {
      v1::DeregisterRequest r;
      r.set_worker_id(absl::StrCat(kind, "-", n));
      v1::DeregisterResponse resp;
      EXPECT_TRUE(
          StubTo<v1::Cluster>(internal())->Deregister(Deadline(seconds(10)).get(), r, &resp).ok());
    }
  }
  ExpectServing();
}

// Item 7: message sizes per listener, request ids, and text prompts bounded
// by bytes before they are tokenized.
TEST_F(SecurityTest, RequestSizesAreBounded) {
  ExpectRefused(Generate(router(), "", std::string(257, 'r')), "request_id");
  EXPECT_TRUE(Generate(router(), "", std::string(256, 'r')).ok());
  v1::ModelInfoResponse info;
  ASSERT_TRUE(StubTo<v1::Generation>(router())
                  ->ModelInfo(Deadline(seconds(10)).get(), v1::ModelInfoRequest(), &info)
                  .ok());
  // Past 16 bytes per token of the context, under the message limit.
  const size_t too_long = 16 * static_cast<size_t>(info.max_context_tokens()) + 1;
  ASSERT_LT(too_long, static_cast<size_t>(kRouterMessageMb) << 20);
  ExpectRefused(Generate(router(), std::string(too_long, 'a')), "bytes per token");
  v1::TokenizeRequest tok;
  tok.set_text(std::string(too_long, 'a'));
  v1::TokenizeResponse toks;
  ExpectRefused(StubTo<v1::Generation>(router())->Tokenize(Deadline(seconds(10)).get(), tok, &toks),
                "bytes per token");
  // A message over the listener's limit never reaches a handler.
  const grpc::Status big =
      Generate(router(), std::string((static_cast<size_t>(kRouterMessageMb) << 20) + 1, 'a'));
  EXPECT_EQ(big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << big.error_message();
  EXPECT_TRUE(Generate(router(), "hello world").ok());
}

// Stop conditions are matched against every token and every piece of text:
// their number and sizes are bounded, the field named.
TEST_F(SecurityTest, StopConditionsAreBounded) {
  auto run = [](const std::function<void(v1::StopConditions*)>& set) {
    v1::GenerateRequest r;
    r.set_text("hello world");
    r.mutable_stop()->set_max_new_tokens(2);
    set(r.mutable_stop());
    auto ctx = Deadline(seconds(60));
    auto reader = StubTo<v1::Generation>(router())->Generate(ctx.get(), r);
    v1::GenerateResponse m;
    while (reader->Read(&m)) {
    }
    return reader->Finish();
  };
  ExpectRefused(run([](v1::StopConditions* s) {
                  for (int i = 0; i < 17; ++i) s->add_stop_strings(absl::StrCat("s", i));
                }),
                "stop_strings");
  ExpectRefused(run([](v1::StopConditions* s) { s->add_stop_strings(std::string(257, 'x')); }),
                "stop_strings");
  ExpectRefused(run([](v1::StopConditions* s) {
                  for (int i = 0; i < 1025; ++i) s->add_stop_token_ids(i % 100);
                }),
                "stop_token_ids");
  const grpc::Status ok = run([](v1::StopConditions* s) {
    for (int i = 0; i < 16; ++i) s->add_stop_strings(std::string(256, 'a' + i));
    for (int i = 0; i < 1024; ++i) s->add_stop_token_ids(i % 100);
  });
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

// The TCP ports process `pid` listens on (/proc: its sockets in LISTEN).
std::set<int> ListeningPorts(pid_t pid) {
  std::set<std::string> inodes;
  const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
  if (DIR* d = opendir(fd_dir.c_str())) {
    while (dirent* e = readdir(d)) {
      char target[256];
      const ssize_t n = readlink((fd_dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1);
      const std::string t(target, n > 0 ? n : 0);
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    closedir(d);
  }
  std::set<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() < 10 || f[3] != "0A" || !inodes.count(f[9])) continue;  // 0A: LISTEN
      int port = 0;
      if (absl::SimpleHexAtoi(f[1].substr(f[1].rfind(':') + 1), &port)) ports.insert(port);
    }
  }
  return ports;
}

int PortOf(const std::string& address) {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port)) << address;
  return port;
}

// Item 9: with --listen=127.0.0.1:0 each service listens on its gRPC port and
// its /metrics port, nothing else (no clone of the gRPC listener).
TEST_F(SecurityTest, OneListenerPerFlag) {
  for (const LocalCluster::Process& p : cluster_->processes()) {
    SCOPED_TRACE(p.name);
    std::set<int> want = {PortOf(p.address), PortOf(p.metrics_address)};
    if (!p.internal_address.empty()) want.insert(PortOf(p.internal_address));  // the router's
    EXPECT_EQ(ListeningPorts(p.pid), want);
  }
}

// Issue 21's two planes: the router's public port serves Generation, not
// Cluster (a client of the API cannot register, deregister or rebalance);
// its internal port serves Cluster, not Generation.
TEST_F(SecurityTest, ThePublicPortServesNoControlPlane) {
  ASSERT_FALSE(internal().empty());
  ASSERT_NE(internal(), router());
  v1::RegisterResponse reg;
  v1::RegisterRequest r = Registration(v1::WORKER_KIND_DECODE, "127.0.0.1:5");
  EXPECT_EQ(
      StubTo<v1::Cluster>(router())->Register(Deadline(seconds(10)).get(), r, &reg).error_code(),
      grpc::StatusCode::UNIMPLEMENTED);
  v1::RebalanceRequest rb;
  v1::RebalanceResponse rbr;
  EXPECT_EQ(
      StubTo<v1::Cluster>(router())->Rebalance(Deadline(seconds(10)).get(), rb, &rbr).error_code(),
      grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_EQ(Generate(internal()).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  ExpectServing();
}

// Item 5: an exact LoadExperts that would take an expert from the only
// worker routed to it is refused, and nothing is dropped; out-of-range ids
// are INVALID_ARGUMENT.
TEST_F(SecurityTest, ExactLoadCannotStrandExperts) {
  const std::string expert = Proc("expert-0").address;
  auto stub = StubTo<v1::ExpertWorker>(expert);
  v1::ExpertInfoResponse before, after;
  ASSERT_TRUE(stub->Info(Deadline(seconds(10)).get(), v1::ExpertInfoRequest(), &before).ok());
  ASSERT_GT(before.expert_ids_size(), 1);
  v1::LoadExpertsRequest exact;
  exact.add_expert_ids(before.expert_ids(0));
  exact.set_exact(true);
  v1::LoadExpertsResponse resp;
  ExpectRefused(stub->LoadExperts(Deadline(seconds(30)).get(), exact, &resp), "expert_ids",
                grpc::StatusCode::FAILED_PRECONDITION);
  for (int bad : {-1, 8, 1000000000}) {
    v1::LoadExpertsRequest r;
    r.add_expert_ids(bad);
    ExpectRefused(stub->LoadExperts(Deadline(seconds(10)).get(), r, &resp), "expert_ids");
  }
  ASSERT_TRUE(stub->Info(Deadline(seconds(10)).get(), v1::ExpertInfoRequest(), &after).ok());
  EXPECT_EQ(after.expert_ids_size(), before.expert_ids_size());
  ExpectServing();
}

// `moesh complete ARGS` against no router (the CLI's own checks).
std::pair<int, std::string> Complete(const std::string& args) {
  return MoeshComplete("127.0.0.1:1", args);
}

// Item 10: the CLI neither wraps ids into int32 nor picks one of two prompts.
TEST(CliSecurityTest, CompleteRefusesWrappedIdsAndTwoPrompts) {
  auto [rc, out] = Complete("--prompt_ids=4294967301");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--prompt_ids: 4294967301 is not a token id"), std::string::npos) << out;
  std::tie(rc, out) = Complete("--prompt_ids=-1");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("is not a token id"), std::string::npos) << out;
  std::tie(rc, out) = Complete("--prompt=hello --prompt_ids=1,2");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--prompt and --prompt_ids exclude each other"), std::string::npos) << out;
}

}  // namespace
}  // namespace moesh
