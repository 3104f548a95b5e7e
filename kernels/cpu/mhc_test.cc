// DeepSeek-V4's CPU pieces against their definitions: the mHC mappings, the
// clamped SwiGLU and sqrt-softplus / hash routing.
#include "kernels/cpu/mhc.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/moe_gate.h"
#include "kernels/cpu/ops.h"

namespace moesh::cpu {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(MhcTest, CombIsDoublyStochasticAndCollapseUsesPre) {
  const int tokens = 3, hc = 4, hidden = 8, mix = (2 + hc) * hc;
  const std::vector<float> x = Random(tokens * hc * hidden, 1),
                           fn = Random(mix * hc * hidden, 2, 0.2f), base = Random(mix, 3),
                           scale = {1.1f, 0.9f, 1.3f};
  std::vector<float> collapsed(tokens * hidden), post(tokens * hc), comb(tokens * hc * hc);
  MhcPreParams p;
  p.x = x.data(), p.num_tokens = tokens, p.hc = hc, p.hidden = hidden;
  p.fn = fn.data(), p.base = base.data(), p.scale = scale.data(), p.sinkhorn_iters = 20;
  p.collapsed = collapsed.data(), p.post = post.data(), p.comb = comb.data();
  RunMhcPre(p);
  for (int t = 0; t < tokens; ++t) {
    for (int i = 0; i < hc; ++i) {
      float row = 0, col = 0;
      for (int j = 0; j < hc; ++j) {
        row += comb[(t * hc + i) * hc + j];
        col += comb[(t * hc + j) * hc + i];
      }
      EXPECT_NEAR(row, 1.0f, 1e-3f);
      EXPECT_NEAR(col, 1.0f, 1e-5f);  // the last normalisation is by column
      EXPECT_GT(post[t * hc + i], 0.0f);
      EXPECT_LT(post[t * hc + i], 2.0f);
    }
  }
  // After the sublayer: x'[k] = post[k] y + sum_j comb[j, k] x[j].
  std::vector<float> y = Random(tokens * hidden, 4), x2 = x;
  RunMhcPost(x2.data(), y.data(), post.data(), comb.data(), tokens, hc, hidden);
  for (int t = 0; t < tokens; ++t) {
    for (int k = 0; k < hc; ++k) {
      for (int d = 0; d < hidden; ++d) {
        double want = post[t * hc + k] * y[t * hidden + d];
        for (int j = 0; j < hc; ++j)
          want += comb[(t * hc + j) * hc + k] * x[(t * hc + j) * hidden + d];
        EXPECT_NEAR(x2[(t * hc + k) * hidden + d], want, 1e-5);
      }
    }
  }
}

TEST(SwigluTest, ClampsGateAboveAndUpBothWays) {
  const std::vector<float> gate_up = {3.0f, -3.0f, 0.5f, 5.0f, -5.0f, 0.25f};  // one row, i = 3
  std::vector<float> out(3);
  SiluAndMul(gate_up.data(), out.data(), 1, 3, /*limit=*/1.0f);
  auto silu = [](float g) { return g / (1.0f + std::exp(-g)); };
  EXPECT_FLOAT_EQ(out[0], silu(1.0f) * 1.0f);    // gate clamped to 1, up to 1
  EXPECT_FLOAT_EQ(out[1], silu(-3.0f) * -1.0f);  // gate only clamped from above
  EXPECT_FLOAT_EQ(out[2], silu(0.5f) * 0.25f);
}

TEST(MoeGateTest, SqrtSoftplusAndHashRouting) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 25.0f};
  const std::vector<float> bias = {0.0f, 10.0f, 0.0f, 0.0f};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  MoeGateParams p;
  p.logits = logits.data(), p.bias = bias.data(), p.num_tokens = 1, p.num_experts = 4, p.top_k = 2;
  p.scoring = GateScoring::kSqrtSoftplus, p.renormalize = true, p.routed_scaling_factor = 1.5f;
  p.topk_ids = ids.data(), p.topk_weights = w.data();
  RunMoeGate(p);
  auto score = [](float x) { return std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x))); };
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3}));  // the bias picks expert 1, not its weight
  EXPECT_NEAR(w[0], 1.5f * score(-1.0f) / (score(-1.0f) + score(25.0f)), 1e-6f);
  // Hash routing: the table's experts, weighted by their scores.
  const std::vector<int32_t> table = {2, 0};
  p.forced_ids = table.data();
  RunMoeGate(p);
  EXPECT_EQ(ids, table);
  EXPECT_NEAR(w[0], 1.5f * score(2.0f) / (score(2.0f) + score(0.5f)), 1e-6f);
}

}  // namespace
}  // namespace moesh::cpu
