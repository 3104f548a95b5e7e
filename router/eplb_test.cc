#include "router/eplb.h"

#include <random>
#include <set>

#include "gtest/gtest.h"

namespace moesh {
namespace {

// The plan's invariants: every expert placed, replicas as counted, no worker
// over its slots or holding an expert twice, loads consistent.
void ExpectValid(const EplbPlan& p, const std::vector<double>& load, int workers, int slots) {
  ASSERT_EQ(static_cast<int>(p.worker_experts.size()), workers);
  std::vector<int> placed(load.size(), 0);
  for (const auto& hosted : p.worker_experts) {
    EXPECT_LE(static_cast<int>(hosted.size()), slots);
    EXPECT_EQ(std::set<int>(hosted.begin(), hosted.end()).size(), hosted.size())
        << "an expert twice on a worker";
    for (int e : hosted) ++placed[e];
  }
  double total = 0;
  for (size_t e = 0; e < load.size(); ++e) {
    EXPECT_GE(placed[e], 1) << "expert " << e << " has no host";
    EXPECT_EQ(placed[e], p.replicas[e]) << "expert " << e;
    total += load[e];
  }
  double sum = 0;
  for (double l : p.worker_load) sum += l;
  EXPECT_NEAR(sum, total, 1e-6 * std::max(1.0, total));
}

TEST(EplbTest, UniformLoadNeedsNoReplicasAndIsBalanced) {
  const std::vector<double> load(16, 100.0);
  absl::StatusOr<EplbPlan> p = PlanExpertPlacement(load, 4, 4);
  ASSERT_TRUE(p.ok());
  ExpectValid(*p, load, 4, 4);
  for (int r : p->replicas) EXPECT_EQ(r, 1);
  EXPECT_DOUBLE_EQ(p->balance_ratio, 1.0);
}

TEST(EplbTest, HotExpertIsReplicatedAcrossWorkers) {
  std::vector<double> load(8, 10.0);
  load[3] = 400.0;                                               // one expert takes most tokens
  absl::StatusOr<EplbPlan> p = PlanExpertPlacement(load, 4, 3);  // 4 spare slots
  ASSERT_TRUE(p.ok());
  ExpectValid(*p, load, 4, 3);
  EXPECT_EQ(p->replicas[3], 4);  // every spare slot went to the hot expert
  EXPECT_LT(p->balance_ratio, 1.1);
  EXPECT_GT(ContiguousBalanceRatio(load, 4), 3.0);  // without EPLB one worker takes ~87%
}

TEST(EplbTest, RandomSkewedLoadsBeatContiguousSharding) {
  std::mt19937 rng(7);
  std::lognormal_distribution<double> skew(0.0, 1.5);
  for (int trial = 0; trial < 50; ++trial) {
    const int experts = 64, workers = 8, slots = 10;  // 16 redundant slots
    std::vector<double> load(experts);
    for (double& l : load) l = skew(rng);
    absl::StatusOr<EplbPlan> p = PlanExpertPlacement(load, workers, slots);
    ASSERT_TRUE(p.ok());
    ExpectValid(*p, load, workers, slots);
    EXPECT_LE(p->balance_ratio, ContiguousBalanceRatio(load, workers) + 1e-9) << "trial " << trial;
    EXPECT_LT(p->balance_ratio, 1.25) << "trial " << trial;
  }
}

TEST(EplbTest, RejectsImpossibleShapes) {
  EXPECT_EQ(PlanExpertPlacement(std::vector<double>(10, 1), 2, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanExpertPlacement(std::vector<double>(4, 1), 0, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanExpertPlacement({1, -2}, 2, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moesh
