// CPU kernels against straightforward re-statements of the math.
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/moe_gate.h"
#include "kernels/cpu/rope.h"

namespace moesh::cpu {
namespace {

std::vector<float> Randn(size_t n, uint32_t seed, float std = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, std);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(OpsTest, LinearMatchesLoops) {
  const int m = 5, n = 7, k = 11;
  std::vector<float> x = Randn(m * k, 1), w = Randn(n * k, 2), y(m * n, -99.0f);
  Linear(x.data(), w.data(), y.data(), m, n, k);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double ref = 0;
      for (int l = 0; l < k; ++l) ref += x[i * k + l] * w[j * k + l];
      EXPECT_NEAR(y[i * n + j], ref, 1e-5);
    }
  }
}

TEST(OpsTest, LinearIsBatchInvariant) {
  // A row's output is bitwise the same alone, in any batch size, at any
  // position, accumulated or not.
  for (auto [n, k] : std::vector<std::pair<int, int>>{{64, 64}, {40, 64}, {512, 96}, {2048, 512}}) {
    std::vector<float> w = Randn(static_cast<size_t>(n) * k, 3), row = Randn(k, 4), alone(n);
    Linear(row.data(), w.data(), alone.data(), 1, n, k);
    for (int m : {2, 3, 7, 8, 9, 17, 33}) {
      std::vector<float> x = Randn(static_cast<size_t>(m) * k, 5 + m),
                         y(static_cast<size_t>(m) * n);
      const int at = m / 2;
      std::copy(row.begin(), row.end(), x.begin() + static_cast<size_t>(at) * k);
      Linear(x.data(), w.data(), y.data(), m, n, k);
      EXPECT_EQ(std::vector<float>(y.begin() + static_cast<size_t>(at) * n,
                                   y.begin() + static_cast<size_t>(at + 1) * n),
                alone)
          << "n " << n << " k " << k << " m " << m;
    }
  }
}

TEST(OpsTest, RmsNormAndSiluAndMul) {
  std::vector<float> x = {1, 2, 3, 4}, w = {1, 1, 2, 2}, y(4);
  RmsNorm(x.data(), w.data(), y.data(), 1, 4, 0.0f);
  const float rms = std::sqrt((1 + 4 + 9 + 16) / 4.0f);
  EXPECT_NEAR(y[0], 1 / rms, 1e-6);
  EXPECT_NEAR(y[3], 8 / rms, 1e-6);
  std::vector<float> gu = {0.0f, 2.0f, 3.0f, 5.0f}, out(2);
  SiluAndMul(gu.data(), out.data(), 1, 2);
  EXPECT_NEAR(out[0], 0.0f, 1e-7);
  EXPECT_NEAR(out[1], 2.0f / (1.0f + std::exp(-2.0f)) * 5.0f, 1e-5);
}

TEST(OpsTest, LogSoftmaxNormalises) {
  std::vector<float> x = Randn(100, 3, 5.0f), lp(100);
  LogSoftmax(x.data(), lp.data(), 100);
  double sum = 0;
  for (float v : lp) sum += std::exp(v);
  EXPECT_NEAR(sum, 1.0, 1e-5);
}

// transformers 5.17's own inv_freq / attention_scaling for the golden configs
// (tests/golden/hf_facts.txt).
TEST(RopeTest, YarnTablesMatchTransformers) {
  YarnParams v3;
  v3.theta = 10000;
  v3.factor = 8;
  v3.original_max_position_embeddings = 32;
  v3.mscale = 1.0;
  v3.mscale_all_dim = 0.8;
  RopeTable t = YarnRopeTable(v3, 8);
  const std::vector<float> want = {1.0f, 0.0125f, 0.00125f, 0.000125f};
  ASSERT_EQ(t.inv_freq.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(t.inv_freq[i], want[i], want[i] * 1e-5) << i;
  EXPECT_NEAR(t.attention_factor, 1.035657f, 1e-5);

  YarnParams v2;
  v2.factor = 4;
  v2.original_max_position_embeddings = 64;
  v2.mscale = 0.707;
  v2.mscale_all_dim = 0.707;
  t = YarnRopeTable(v2, 8);
  const std::vector<float> want2 = {1.0f, 0.0625f, 0.0025f, 0.00025f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(t.inv_freq[i], want2[i], want2[i] * 1e-5) << i;
  EXPECT_FLOAT_EQ(t.attention_factor, 1.0f);

  t = DefaultRopeTable(10000, 8);
  const std::vector<float> want3 = {1.0f, 0.1f, 0.01f, 0.001f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(t.inv_freq[i], want3[i], want3[i] * 1e-6) << i;
}

TEST(RopeTest, LayoutsRotateTheSamePairs) {
  // Rotating (a, b) pairs laid out interleaved or in halves gives the same
  // rotated pairs, and rotation preserves dot products of equal positions.
  RopeTable t = DefaultRopeTable(10000, 8);
  std::vector<float> pairs = Randn(8, 4);
  std::vector<float> inter(8), halves(8);
  for (int i = 0; i < 4; ++i) {
    inter[2 * i] = halves[i] = pairs[2 * i];
    inter[2 * i + 1] = halves[i + 4] = pairs[2 * i + 1];
  }
  RopeParams p;
  p.num_rows = 1;
  p.dim = 8;
  p.position = 37;
  p.table = &t;
  p.x = inter.data();
  p.layout = RopeLayout::kInterleaved;
  RunRope(p);
  p.x = halves.data();
  p.layout = RopeLayout::kHalves;
  RunRope(p);
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(inter[2 * i], halves[i]);
    EXPECT_FLOAT_EQ(inter[2 * i + 1], halves[i + 4]);
    EXPECT_NEAR(inter[2 * i] * inter[2 * i] + inter[2 * i + 1] * inter[2 * i + 1],
                pairs[2 * i] * pairs[2 * i] + pairs[2 * i + 1] * pairs[2 * i + 1], 1e-5);
  }
  // Pair 0 turns by exactly position * inv_freq[0] radians.
  const float a = 37.0f;
  EXPECT_NEAR(inter[0], pairs[0] * std::cos(a) - pairs[1] * std::sin(a), 1e-5);
}

// MLA with absorbed weights equals expanding the latent cache into per-head
// keys and values (what transformers does).
TEST(MlaAttentionTest, AbsorbedEqualsExpanded) {
  const int heads = 3, nope = 8, rope = 4, r = 16, v = 6, num_kv = 11, num_q = 4, start = 7;
  const int qk = nope + rope;
  std::vector<float> q = Randn(num_q * heads * qk, 10), kv = Randn(num_kv * (r + rope), 11),
                     w = Randn(heads * (nope + v) * r, 12, 0.3f), out(num_q * heads * v, NAN);
  MlaAttentionParams p;
  p.q = q.data();
  p.num_q = num_q;
  p.num_heads = heads;
  p.qk_nope_head_dim = nope;
  p.qk_rope_head_dim = rope;
  p.kv_lora_rank = r;
  p.v_head_dim = v;
  p.kv = kv.data();
  p.num_kv = num_kv;
  p.q_start_pos = start;
  p.w_kv_b = w.data();
  p.softmax_scale = 0.3f;
  p.out = out.data();
  RunMlaAttention(p);
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < num_q; ++i) {
      const int visible = start + i + 1;
      std::vector<double> s(visible);
      double mx = -1e30;
      for (int j = 0; j < visible; ++j) {
        double dot = 0;
        for (int d = 0; d < nope; ++d) {  // k_nope[j, h, d] = W_UK[h, d, :] · latent[j]
          double k = 0;
          for (int c = 0; c < r; ++c) k += w[(h * (nope + v) + d) * r + c] * kv[j * (r + rope) + c];
          dot += q[(i * heads + h) * qk + d] * k;
        }
        for (int d = 0; d < rope; ++d)
          dot += q[(i * heads + h) * qk + nope + d] * kv[j * (r + rope) + r + d];
        s[j] = dot * 0.3;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int d = 0; d < v; ++d) {
        double o = 0;
        for (int j = 0; j < visible; ++j) {
          double val = 0;
          for (int c = 0; c < r; ++c)
            val += w[(h * (nope + v) + nope + d) * r + c] * kv[j * (r + rope) + c];
          o += s[j] / sum * val;
        }
        EXPECT_NEAR(out[(i * heads + h) * v + d], o, 1e-4) << "h " << h << " q " << i << " d " << d;
      }
    }
  }
}

struct GateCase {
  GateScoring scoring;
  GateSelect select;
  bool renormalize;
};

// Reference routing written the way transformers states it.
void ReferenceGate(const std::vector<float>& logits, const std::vector<float>& bias, int e, int k,
                   int groups, int topk_group, const GateCase& gc, float scale,
                   std::vector<int>* ids, std::vector<float>* w) {
  std::vector<double> score(e), choice(e);
  double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
  for (int i = 0; i < e; ++i) {
    score[i] = gc.scoring == GateScoring::kSoftmax ? std::exp(logits[i] - mx)
                                                   : 1 / (1 + std::exp(-logits[i]));
    sum += score[i];
  }
  if (gc.scoring == GateScoring::kSoftmax)
    for (double& s : score) s /= sum;
  for (int i = 0; i < e; ++i) choice[i] = score[i] + (bias.empty() ? 0 : bias[i]);
  const int per = e / groups;
  if (gc.select != GateSelect::kGreedy) {
    std::vector<std::pair<double, int>> gs;
    for (int g = 0; g < groups; ++g) {
      std::vector<double> m(choice.begin() + g * per, choice.begin() + (g + 1) * per);
      std::sort(m.rbegin(), m.rend());
      gs.push_back({gc.select == GateSelect::kGroupMax ? m[0] : m[0] + m[1], g});
    }
    std::sort(gs.rbegin(), gs.rend());
    for (int j = topk_group; j < groups; ++j) {
      for (int i = 0; i < per; ++i) choice[gs[j].second * per + i] = -1e30;
    }
  }
  std::vector<std::pair<double, int>> all;
  for (int i = 0; i < e; ++i) all.push_back({choice[i], i});
  std::sort(all.rbegin(), all.rend());
  double tot = 0;
  for (int j = 0; j < k; ++j) tot += score[all[j].second];
  ids->clear();
  w->clear();
  for (int j = 0; j < k; ++j) {
    ids->push_back(all[j].second);
    w->push_back(
        static_cast<float>(score[all[j].second] / (gc.renormalize ? tot + 1e-20 : 1.0) * scale));
  }
}

class MoeGateTest : public ::testing::TestWithParam<GateCase> {};

TEST_P(MoeGateTest, MatchesReference) {
  const int e = 16, k = 3, groups = 4, topk_group = 2, tokens = 50;
  const GateCase gc = GetParam();
  std::vector<float> logits = Randn(tokens * e, 20, 2.0f);
  std::vector<float> bias =
      gc.select == GateSelect::kGroupTop2Sum ? Randn(e, 21, 0.3f) : std::vector<float>();
  std::vector<int32_t> ids(tokens * k, -1);
  std::vector<float> w(tokens * k, NAN);
  MoeGateParams p;
  p.logits = logits.data();
  p.bias = bias.empty() ? nullptr : bias.data();
  p.num_tokens = tokens;
  p.num_experts = e;
  p.top_k = k;
  p.n_group = gc.select == GateSelect::kGreedy ? 1 : groups;
  p.topk_group = gc.select == GateSelect::kGreedy ? 1 : topk_group;
  p.scoring = gc.scoring;
  p.select = gc.select;
  p.renormalize = gc.renormalize;
  p.routed_scaling_factor = 2.5f;
  p.topk_ids = ids.data();
  p.topk_weights = w.data();
  RunMoeGate(p);
  for (int t = 0; t < tokens; ++t) {
    std::vector<float> row(logits.begin() + t * e, logits.begin() + (t + 1) * e);
    std::vector<int> rid;
    std::vector<float> rw;
    ReferenceGate(row, bias, e, k, p.n_group, p.topk_group, gc, 2.5f, &rid, &rw);
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(ids[t * k + j], rid[j]) << "token " << t;
      EXPECT_NEAR(w[t * k + j], rw[j], 1e-5) << "token " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Methods, MoeGateTest,
    ::testing::Values(GateCase{GateScoring::kSoftmax, GateSelect::kGreedy, false},
                      GateCase{GateScoring::kSoftmax, GateSelect::kGreedy, true},
                      GateCase{GateScoring::kSoftmax, GateSelect::kGroupMax, false},
                      GateCase{GateScoring::kSigmoid, GateSelect::kGroupTop2Sum, true},
                      GateCase{GateScoring::kSigmoid, GateSelect::kGroupTop2Sum, false}));

TEST(MoeGateTest, GroupLimitKeepsChoicesInsideChosenGroups) {
  // Expert 0 has the best single score but its group is weak overall (V3).
  const int e = 8;
  std::vector<float> logits = {5, -5, -5, -5, 1, 1, 0.9f, 0.9f};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  MoeGateParams p;
  p.logits = logits.data();
  p.num_tokens = 1;
  p.num_experts = e;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 1;
  p.scoring = GateScoring::kSigmoid;
  p.select = GateSelect::kGroupTop2Sum;
  p.topk_ids = ids.data();
  p.topk_weights = w.data();
  RunMoeGate(p);
  // Group sums of top-2 sigmoid: g0 = s(5) + s(-5) ≈ 1.0; g2 = 2 s(1) ≈ 1.46.
  EXPECT_EQ(ids[0], 4);
  EXPECT_EQ(ids[1], 5);
}

}  // namespace
}  // namespace moesh::cpu
