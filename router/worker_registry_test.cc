// WorkerRegistry without RPCs: registration checks, heartbeats, the sweep that
// drops silent workers (cancelling their tracked calls), and the placement
// map's versions.
#include "router/worker_registry.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace moesh {
namespace {

using std::chrono::milliseconds;

WorkerRegistration Worker(v1::WorkerKind kind, const std::string& address,
                          std::vector<int> experts = {}) {
  WorkerRegistration r;
  r.kind = kind;
  r.address = address;
  r.expert_ids = std::move(experts);
  r.model_fingerprint = "fp";
  return r;
}

TEST(WorkerRegistryTest, RefusesAnotherModelAndIncompleteRegistrations) {
  WorkerRegistry registry("fp", milliseconds(50), milliseconds(10000));
  WorkerRegistration other = Worker(v1::WORKER_KIND_DECODE, "a:1");
  other.model_fingerprint = "another";
  EXPECT_EQ(registry.Register(other).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry.Register(Worker(v1::WORKER_KIND_UNSPECIFIED, "a:1")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry.Register(Worker(v1::WORKER_KIND_DECODE, "")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry.Live(v1::WORKER_KIND_DECODE).empty());
}

TEST(WorkerRegistryTest, SameAddressReplacesTheWorker) {
  WorkerRegistry registry("fp", milliseconds(50), milliseconds(10000));
  absl::StatusOr<std::string> first = registry.Register(Worker(v1::WORKER_KIND_DECODE, "a:1"));
  ASSERT_TRUE(first.ok());
  std::atomic<int> cancelled{0};
  registry.Track(*first, [&] { ++cancelled; });
  absl::StatusOr<std::string> second = registry.Register(Worker(v1::WORKER_KIND_DECODE, "a:1"));
  ASSERT_TRUE(second.ok());
  EXPECT_NE(*first, *second);
  EXPECT_FALSE(registry.IsLive(*first));
  EXPECT_TRUE(registry.IsLive(*second));
  EXPECT_EQ(registry.Live(v1::WORKER_KIND_DECODE).size(), 1u);
  // The old one's calls are cancelled at the next sweep.
  for (int i = 0; i < 100 && cancelled.load() == 0; ++i)
    std::this_thread::sleep_for(milliseconds(10));
  EXPECT_EQ(cancelled.load(), 1);
}

TEST(WorkerRegistryTest, HeartbeatsKeepAWorkerAndSilenceDropsItWithItsCalls) {
  WorkerRegistry registry("fp", milliseconds(20), milliseconds(500));
  absl::StatusOr<std::string> id = registry.Register(Worker(v1::WORKER_KIND_PREFILL, "p:1"));
  ASSERT_TRUE(id.ok());
  std::atomic<int> cancelled{0};
  const int64_t kept = registry.Track(*id, [&] { ++cancelled; });
  const int64_t untracked = registry.Track(*id, [&] { cancelled += 100; });
  registry.Untrack(untracked);
  v1::WorkerLoad load;
  load.set_queued_prompt_tokens(42);
  for (int i = 0; i < 10; ++i) {  // 500 ms of heartbeats: kept
    EXPECT_TRUE(registry.Heartbeat(*id, load, 0).known);
    std::this_thread::sleep_for(milliseconds(50));
  }
  ASSERT_TRUE(registry.IsLive(*id));
  EXPECT_EQ(registry.Live(v1::WORKER_KIND_PREFILL).at(0).load.queued_prompt_tokens(), 42);
  for (int i = 0; i < 100 && registry.IsLive(*id); ++i)
    std::this_thread::sleep_for(milliseconds(20));
  EXPECT_FALSE(registry.IsLive(*id));
  EXPECT_EQ(cancelled.load(), 1);
  EXPECT_FALSE(registry.Heartbeat(*id, load, 0).known);  // it must register again
  registry.Untrack(kept);
}

TEST(WorkerRegistryTest, DeregisterLetsCallsDrain) {
  WorkerRegistry registry("fp", milliseconds(20), milliseconds(10000));
  absl::StatusOr<std::string> id = registry.Register(Worker(v1::WORKER_KIND_DECODE, "d:1"));
  ASSERT_TRUE(id.ok());
  std::atomic<int> cancelled{0};
  registry.Track(*id, [&] { ++cancelled; });
  registry.Deregister(*id);
  EXPECT_FALSE(registry.IsLive(*id));
  std::this_thread::sleep_for(milliseconds(100));  // a few sweeps
  EXPECT_EQ(cancelled.load(), 0);
}

TEST(WorkerRegistryTest, PlacementVersionsFollowExpertWorkersAndPlans) {
  WorkerRegistry registry("fp", milliseconds(50), milliseconds(10000));
  const int64_t v0 = registry.Placement().version;
  absl::StatusOr<std::string> e1 = registry.Register(Worker(v1::WORKER_KIND_EXPERT, "e:1", {0, 1}));
  ASSERT_TRUE(e1.ok());
  absl::StatusOr<std::string> attn = registry.Register(Worker(v1::WORKER_KIND_DECODE, "d:1"));
  ASSERT_TRUE(attn.ok());
  const PlacementMap joined = registry.Placement();
  EXPECT_EQ(joined.version, v0 + 1);  // an expert worker joined; a decode worker does not count
  ASSERT_EQ(joined.workers.size(), 1u);
  EXPECT_EQ(joined.workers[0].data_plane_address, "e:1");
  EXPECT_EQ(joined.workers[0].expert_ids, (std::vector<int>{0, 1}));

  const int64_t v = registry.SetPlacement({{*e1, {0, 1, 2}}, {"EXPERT-gone", {3}}});
  EXPECT_EQ(v, joined.version + 1);
  EXPECT_EQ(registry.Placement().workers[0].expert_ids, (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(registry.AttentionWorkersFollow(v));
  EXPECT_EQ(registry.Heartbeat(*attn, v1::WorkerLoad(), v).placement_version, v);
  EXPECT_TRUE(registry.AttentionWorkersFollow(v));
}

v1::WorkerLoad Hosting(std::vector<int> experts) {
  v1::WorkerLoad load;
  load.mutable_hosted_expert_ids()->Add(experts.begin(), experts.end());
  return load;
}

// Router HA: a router that did not place an expert worker's experts routes to
// what the worker reports holding; once it placed them, to its plan's experts
// the worker holds.
TEST(WorkerRegistryTest, TheMapFollowsWhatExpertWorkersHoldUntilThisRouterPlacesThem) {
  WorkerRegistry registry("fp", milliseconds(50), milliseconds(10000));
  absl::StatusOr<std::string> e = registry.Register(Worker(v1::WORKER_KIND_EXPERT, "e:1", {0, 1}));
  ASSERT_TRUE(e.ok());
  const int64_t v0 = registry.Placement().version;
  // Another router's rebalance loaded expert 2 here: this router routes to it.
  EXPECT_EQ(registry.Heartbeat(*e, Hosting({2, 0, 1}), 0).placement_version, v0 + 1);
  EXPECT_EQ(registry.Placement().workers[0].expert_ids, (std::vector<int>{0, 1, 2}));
  // The same holding again changes nothing.
  EXPECT_EQ(registry.Heartbeat(*e, Hosting({0, 1, 2}), 0).placement_version, v0 + 1);
  // And it dropped expert 0.
  registry.Heartbeat(*e, Hosting({1, 2}), 0);
  EXPECT_EQ(registry.Placement().workers[0].expert_ids, (std::vector<int>{1, 2}));

  // This router's own plan: the planned experts the worker holds, no more.
  const int64_t v = registry.SetPlacement({{*e, {2}}});
  registry.Heartbeat(*e, Hosting({1, 2}), 0);  // a cold replica, held, not routed
  EXPECT_EQ(registry.Placement().version, v);
  EXPECT_EQ(registry.Placement().workers[0].expert_ids, (std::vector<int>{2}));
}

TEST(WorkerRegistryTest, NotThePlacementWriterWhileAttentionWorkersRouteElsewhere) {
  WorkerRegistry registry("fp", milliseconds(50), milliseconds(10000));
  EXPECT_TRUE(registry.IsPlacementWriter());  // no attention worker: nobody objects
  absl::StatusOr<std::string> d = registry.Register(Worker(v1::WORKER_KIND_DECODE, "d:1"));
  ASSERT_TRUE(d.ok());
  registry.Heartbeat(*d, v1::WorkerLoad(), 0, /*elsewhere=*/true);
  EXPECT_FALSE(registry.IsPlacementWriter());
  registry.Heartbeat(*d, v1::WorkerLoad(), 3, /*elsewhere=*/false);
  EXPECT_TRUE(registry.IsPlacementWriter());
}

}  // namespace
}  // namespace moesh
