// MoE gate and greedy/top-k log-probabilities against the CPU references:
// the same ids exactly, weights and log-probabilities within fp32 rounding.
#include <algorithm>
#include <cmath>

#include "common/engine/sampler.h"
#include "gtest/gtest.h"
#include "kernels/cpu/moe_gate.h"
#include "kernels/cuda/routing.h"
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
      {"v2-lite greedy", 64, 6, 1, 1, GateScoring::kSoftmax, GateSelect::kGreedy, false, false, 1.0f},
      {"v2 group max", 160, 6, 8, 3, GateScoring::kSoftmax, GateSelect::kGroupMax, false, false, 16.0f},
      {"v3 noaux_tc", 256, 8, 8, 4, GateScoring::kSigmoid, GateSelect::kGroupTop2Sum, true, true, 2.5f},
      {"sigmoid greedy, 72 experts", 72, 5, 1, 1, GateScoring::kSigmoid, GateSelect::kGreedy, true, true, 1.0f},
      {"512 experts, top 32", 512, 32, 16, 8, GateScoring::kSoftmax, GateSelect::kGroupTop2Sum, false, true, 1.0f},
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
      MOESH_ASSERT_OK_AND_ASSIGN(auto dids, DeviceBuffer<int32_t>::Create(static_cast<size_t>(tokens) * c.top_k));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dw, DeviceBuffer<float>::Create(static_cast<size_t>(tokens) * c.top_k));
      MOESH_ASSERT_OK(Poison(dids));
      MOESH_ASSERT_OK(Poison(dw));
      MoeGateParams p;
      p.logits = dlogits.get(), p.bias = c.bias ? dbias.get() : nullptr;
      p.num_tokens = tokens, p.num_experts = c.experts, p.top_k = c.top_k;
      p.n_group = c.n_group, p.topk_group = c.topk_group, p.scoring = c.scoring, p.select = c.select;
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
      r.n_group = c.n_group, r.topk_group = c.topk_group, r.scoring = c.scoring, r.select = c.select;
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

TEST(GreedyLogprobsTest, MatchesSamplerTopLogprobs) {
  MOESH_REQUIRE_GPU();
  struct Case { int batch, vocab, ld, top_k; };
  for (const Case c : {Case{5, 102400, 0, 20}, Case{3, 129280, 0, 0}, Case{4, 1001, 1003, 7},
                       Case{2, 50, 0, 20}, Case{1, 32000, 32004, 1}}) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << "vocab=" << c.vocab << " top_k=" << c.top_k << " seed=" << seed);
    std::mt19937 rng(seed);
    const int ld = c.ld ? c.ld : c.vocab;
    std::vector<float> logits = Randn(static_cast<size_t>(c.batch) * ld, rng, 3.0f);
    MOESH_ASSERT_OK_AND_ASSIGN(auto dl, Upload(logits));
    const size_t k_slots = static_cast<size_t>(c.batch) * std::max(c.top_k, 1);
    MOESH_ASSERT_OK_AND_ASSIGN(auto dnext, DeviceBuffer<int32_t>::Create(c.batch));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dnext_lp, DeviceBuffer<float>::Create(c.batch));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dids, DeviceBuffer<int32_t>::Create(k_slots));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dlp, DeviceBuffer<float>::Create(k_slots));
    for (auto* b : {&dnext, &dids}) MOESH_ASSERT_OK(Poison(*b));
    for (auto* b : {&dnext_lp, &dlp}) MOESH_ASSERT_OK(Poison(*b));
    GreedyLogprobsParams p;
    p.logits = dl.get(), p.batch = c.batch, p.vocab = c.vocab, p.ld = c.ld, p.top_k = c.top_k;
    p.next_ids = dnext.get(), p.next_logprobs = dnext_lp.get();
    p.topk_ids = dids.get(), p.topk_logprobs = dlp.get();
    MOESH_ASSERT_OK(RunGreedyLogprobs(p));
    MOESH_ASSERT_OK_AND_ASSIGN(auto next, dnext.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(auto next_lp, dnext_lp.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(auto ids, dids.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(auto lps, dlp.ToHost());
    for (int b = 0; b < c.batch; ++b) {
      const float* row = logits.data() + static_cast<size_t>(b) * ld;
      const std::vector<TokenLogprob> ref = Sampler::TopLogprobs(row, c.vocab, std::max(c.top_k, 1));
      EXPECT_EQ(next[b], ref[0].id) << "row " << b;
      EXPECT_NEAR(next_lp[b], ref[0].logprob, 2e-5f) << "row " << b;
      for (int k = 0; k < c.top_k; ++k) {
        EXPECT_EQ(ids[static_cast<size_t>(b) * c.top_k + k], ref[k].id) << "row " << b << " rank " << k;
        EXPECT_NEAR(lps[static_cast<size_t>(b) * c.top_k + k], ref[k].logprob, 2e-5f) << "row " << b << " rank " << k;
      }
    }
  }
}

}  // namespace
}  // namespace moesh::cuda
