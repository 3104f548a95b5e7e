// The MoE gate against the CPU reference (kernels/cpu/moe_gate): the same
// ids exactly, weights within fp32 rounding. (The greedy/top-k
// log-probabilities kernel is tested against the engine's Sampler in
// common/cuda_backend/sample_test.cc.)
#include "kernels/cuda/routing.h"

#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"
#include "kernels/cpu/moe_gate.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::FreshSeed;
using testing::Poison;
using testing::Randn;
using testing::Upload;

struct GateCase {
  const char* name;
  int experts, top_k, n_group, topk_group;
  GateScoring scoring;
  GateSelect select;
  bool bias, renormalize;
  float scale;
};

TEST(MoeGateTest, MatchesCpuExactly) {
  MOESH_REQUIRE_GPU();
  const GateCase cases[] = {
      {"v2-lite greedy", 64, 6, 1, 1, GateScoring::kSoftmax, GateSelect::kGreedy, false, false,
       1.0f},
      {"v2 group max", 160, 6, 8, 3, GateScoring::kSoftmax, GateSelect::kGroupMax, false, false,
       16.0f},
      {"v3 noaux_tc", 256, 8, 8, 4, GateScoring::kSigmoid, GateSelect::kGroupTop2Sum, true, true,
       2.5f},
      {"sigmoid greedy, 72 experts", 72, 5, 1, 1, GateScoring::kSigmoid, GateSelect::kGreedy, true,
       true, 1.0f},
      {"512 experts, top 32", 512, 32, 16, 8, GateScoring::kSoftmax, GateSelect::kGroupTop2Sum,
       false, true, 1.0f},
  };
  for (const GateCase& c : cases) {
    for (int tokens : {1, 131}) {
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message() << c.name << " tokens=" << tokens << " seed=" << seed);
      std::mt19937 rng(seed);
      std::vector<float> logits = Randn(static_cast<size_t>(tokens) * c.experts, rng, 2.0f);
      std::vector<float> bias = Randn(c.experts, rng, 0.1f);
      MOESH_ASSERT_OK_AND_ASSIGN(auto dlogits, Upload(logits));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dbias, Upload(bias));
      MOESH_ASSERT_OK_AND_ASSIGN(
          auto dids, DeviceBuffer<int32_t>::Create(static_cast<size_t>(tokens) * c.top_k));
      MOESH_ASSERT_OK_AND_ASSIGN(
          auto dw, DeviceBuffer<float>::Create(static_cast<size_t>(tokens) * c.top_k));
      MOESH_ASSERT_OK(Poison(dids));
      MOESH_ASSERT_OK(Poison(dw));
      MoeGateParams p;
      p.logits = dlogits.get(), p.bias = c.bias ? dbias.get() : nullptr;
      p.num_tokens = tokens, p.num_experts = c.experts, p.top_k = c.top_k;
      p.n_group = c.n_group, p.topk_group = c.topk_group, p.scoring = c.scoring,
      p.select = c.select;
      p.renormalize = c.renormalize, p.routed_scaling_factor = c.scale;
      p.topk_ids = dids.get(), p.topk_weights = dw.get();
      MOESH_ASSERT_OK(RunMoeGate(p));
      MOESH_ASSERT_OK_AND_ASSIGN(auto ids, dids.ToHost());
      MOESH_ASSERT_OK_AND_ASSIGN(auto w, dw.ToHost());

      std::vector<int32_t> ref_ids(ids.size());
      std::vector<float> ref_w(w.size());
      cpu::MoeGateParams r;
      r.logits = logits.data(), r.bias = c.bias ? bias.data() : nullptr;
      r.num_tokens = tokens, r.num_experts = c.experts, r.top_k = c.top_k;
      r.n_group = c.n_group, r.topk_group = c.topk_group, r.scoring = c.scoring,
      r.select = c.select;
      r.renormalize = c.renormalize, r.routed_scaling_factor = c.scale;
      r.topk_ids = ref_ids.data(), r.topk_weights = ref_w.data();
      cpu::RunMoeGate(r);
      EXPECT_EQ(ids, ref_ids);
      for (size_t i = 0; i < w.size(); ++i) {
        ASSERT_NEAR(w[i], ref_w[i], 1e-5f * std::max(1.0f, std::fabs(ref_w[i]))) << "pick " << i;
      }
    }
  }
}

}  // namespace
}  // namespace moesh::cuda
