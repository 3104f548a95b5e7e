// Router HA against real processes (LocalCluster with two routers): every
// worker registers and heartbeats with both; a SIGKILLed router fails only
// its own streams while the other router serves on with all its members;
// `moesh complete` given both routers takes a request to the live one; the
// killed router, restarted on its ports, rebuilds its membership from the
// workers' heartbeats and serves again.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/local_cluster.h"
#include "gtest/gtest.h"
#include "moesh/v1/generation.grpc.pb.h"
#include "moesh/v1/worker.grpc.pb.h"
#include "tests/integration/cluster_harness.h"
#include "tests/security/moesh_complete.h"

namespace moesh {
namespace {

constexpr int kLong = 400;  // tokens: the streams outlive the kill at their 10th

// The members router `name` holds, per kind, from its /metrics.
std::vector<double> Members(const LocalCluster& c, const std::string& name) {
  const std::string m = Proc(c, name).metrics_address;
  std::vector<double> out;
  for (const char* kind : {"prefill", "decode", "expert"})
    out.push_back(
        Metric(m, absl::StrCat("moesh_router_workers{service=\"router\",kind=\"", kind, "\"}")));
  return out;
}

// Waits up to `timeout` for router `name` to hold every worker of the cluster
// (one prefill, one decode, two expert workers).
bool HoldsEveryWorker(const LocalCluster& c, const std::string& name,
                      std::chrono::seconds timeout) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < give_up) {
    if (Members(c, name) == std::vector<double>({1, 1, 2})) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

// The expert workers router `internal` (its internal plane) routes to.
int PlacementWorkers(const std::string& internal) {
  auto stub =
      v1::Cluster::NewStub(grpc::CreateChannel(internal, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::PlacementMap map;
  const grpc::Status s = stub->GetPlacement(&ctx, v1::GetPlacementRequest(), &map);
  return s.ok() ? map.workers_size() : -1;
}

TEST(RouterHaTest, ARouterDeathFailsOnlyItsOwnStreamsAndItRejoinsOnRestart) {
  LocalClusterOptions o = Options(TinyModel(), "router_ha");
  o.num_routers = 2;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  LocalCluster& c = **cluster;
  const std::vector<std::string> routers = c.router_addresses();
  ASSERT_EQ(routers.size(), 2u);
  const std::string a = routers[0], b = routers[1];
  const std::string a_internal = Proc(c, "router-0").internal_address;

  // Both routers hold every worker, and both serve the same tokens.
  EXPECT_TRUE(HoldsEveryWorker(c, "router-0", std::chrono::seconds(10)))
      << "router-0 holds prefill/decode/expert "
      << ::testing::PrintToString(Members(c, "router-0"));
  EXPECT_TRUE(HoldsEveryWorker(c, "router-1", std::chrono::seconds(10)))
      << "router-1 holds prefill/decode/expert "
      << ::testing::PrintToString(Members(c, "router-1"));
  const v1::GenerateRequest req = Request({5, 17, 300, 42}, kLong);
  const Result via_a = Call(a, req), via_b = Call(b, req);
  ASSERT_TRUE(via_a.status.ok()) << via_a.status.error_message();
  ASSERT_TRUE(via_b.status.ok()) << via_b.status.error_message();
  ASSERT_EQ(via_a.ids.size(), static_cast<size_t>(kLong));
  EXPECT_EQ(via_a.ids, via_b.ids);

  // A stream on each router; router A is killed at its stream's 10th token.
  Result on_b;
  std::thread b_stream([&] { on_b = Call(b, req); });
  const Result on_a = Call(a, req, [&](grpc::ClientContext*, int n) {
    if (n == 10) {
      EXPECT_TRUE(c.Signal("router-0", SIGKILL).ok());
    }
  });
  b_stream.join();
  EXPECT_FALSE(on_a.status.ok()) << "router A's own stream cannot outlive it";
  EXPECT_LT(on_a.ids.size(), static_cast<size_t>(kLong));
  ASSERT_TRUE(on_b.status.ok()) << "router B's stream failed with router A: "
                                << on_b.status.error_message();
  EXPECT_EQ(on_b.ids, via_b.ids);

  // Router B serves on without a failure, past the heartbeat timeout (1.5 s),
  // and keeps every worker: their heartbeats to it never waited on router A.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
  int served = 0;
  while (std::chrono::steady_clock::now() < until) {
    const Result r = Call(b, Request({7, 8, 9}, 8));
    ASSERT_TRUE(r.status.ok()) << "request " << served << " through router B after router A's "
                               << "death: " << r.status.error_message();
    ++served;
  }
  EXPECT_GT(served, 0);
  EXPECT_EQ(Members(c, "router-1"), std::vector<double>({1, 1, 2}));

  // A client that knows both routers takes a request to the live one.
  const auto [rc, out] =
      MoeshComplete(absl::StrCat(a, ",", b), "--prompt_ids=5,17,300 --max_new_tokens=4 --json");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find(absl::StrCat("router ", a, " unavailable")), std::string::npos) << out;
  EXPECT_NE(out.find("\"finish_reason\":\"length\""), std::string::npos) << out;

  // Restarted on its ports, router A rebuilds its membership from the
  // heartbeats (the workers re-register) and serves again.
  ASSERT_TRUE(c.Restart("router-0").ok());
  ASSERT_TRUE(c.WaitUntilRouterServing(a, std::chrono::seconds(30)).ok());
  EXPECT_TRUE(HoldsEveryWorker(c, "router-0", std::chrono::seconds(10)))
      << "restarted router-0 holds " << ::testing::PrintToString(Members(c, "router-0"));
  EXPECT_EQ(PlacementWorkers(a_internal), 2);
  const Result again = Call(a, req);
  ASSERT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.ids, via_a.ids);
}

}  // namespace
}  // namespace moesh
