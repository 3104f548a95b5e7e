#include "common/engine/sampler.h"

#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "gtest/gtest.h"

namespace moesh {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 0.5f, 2.9f};

TEST(SamplerTest, GreedyIsArgmax) {
  Sampler s(SamplingParams{});
  EXPECT_EQ(s.Sample(kLogits.data(), 5, 0, {}, {}), 1);
}

TEST(SamplerTest, SeedReproduces) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler a(p), b(p);
  std::vector<int> xa, xb;
  for (int i = 0; i < 50; ++i) {
    xa.push_back(a.Sample(kLogits.data(), 5, i, {}, {}));
    xb.push_back(b.Sample(kLogits.data(), 5, i, {}, {}));
  }
  EXPECT_EQ(xa, xb);
  EXPECT_GT(std::set<int>(xa.begin(), xa.end()).size(), 1u);  // actually random
}

TEST(SamplerTest, FrequenciesFollowSoftmax) {
  SamplingParams p;
  p.temperature = 0.7f;
  p.seed = 1;
  Sampler s(p);
  std::map<int, int> count;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[s.Sample(kLogits.data(), 5, i, {}, {})];
  double z = 0;
  for (float l : kLogits) z += std::exp(l / 0.7);
  for (int i = 0; i < 5; ++i) {
    const double want = std::exp(kLogits[i] / 0.7) / z;
    EXPECT_NEAR(count[i] / static_cast<double>(n), want, 0.015) << i;
  }
}

TEST(SamplerTest, TruncationsKeepOnlyAllowedTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 3;
  p.top_k = 2;  // {1, 4}
  Sampler k2(p);
  for (int i = 0; i < 200; ++i) {
    const int t = k2.Sample(kLogits.data(), 5, i, {}, {});
    EXPECT_TRUE(t == 1 || t == 4) << t;
  }
  p.top_k = 0;
  p.top_p = 0.01f;  // only the best token
  Sampler tp(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(tp.Sample(kLogits.data(), 5, i, {}, {}), 1);
  p.top_p = 1.0f;
  p.min_p = 0.8f;  // p(4)/p(1) = e^-0.1 ≈ 0.905 stays, p(2)/p(1) = e^-1 goes
  Sampler mp(p);
  for (int i = 0; i < 200; ++i) {
    const int t = mp.Sample(kLogits.data(), 5, i, {}, {});
    EXPECT_TRUE(t == 1 || t == 4) << t;
  }
}

TEST(SamplerTest, DrawDependsOnlyOnSeedAndStep) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 9;
  Sampler a(p), b(p);
  // b skips ahead: step 5 from a fresh sampler equals step 5 after 0..4.
  for (int i = 0; i < 5; ++i) a.Sample(kLogits.data(), 5, i, {}, {});
  EXPECT_EQ(a.Sample(kLogits.data(), 5, 5, {}, {}), b.Sample(kLogits.data(), 5, 5, {}, {}));
}

// A request continued after k tokens with SeedAtStep(seed, k) takes the
// draws the uninterrupted one would have from step k on.
TEST(SamplerTest, SeedAtStepContinuesTheDraws) {
  for (uint64_t seed : {uint64_t{0}, uint64_t{7}, ~uint64_t{0}, uint64_t{0x123456789ABCDEFull}}) {
    SamplingParams p;
    p.temperature = 0.8f;
    p.seed = seed;
    const Sampler whole(p);
    for (int k : {0, 1, 17, 1000}) {
      SamplingParams q = p;
      q.seed = Sampler::SeedAtStep(seed, k);
      const Sampler rest(q);
      for (int i = 0; i < 5; ++i) EXPECT_EQ(rest.Draw(i), whole.Draw(k + i)) << seed << " " << k;
    }
  }
  EXPECT_EQ(Sampler::SeedAtStep(42, 0), 42u);
}

TEST(SamplerTest, NonFiniteLogits) {
  const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
  SamplingParams greedy, hot;
  hot.temperature = 1.0f;
  const std::vector<float> with_nan = {nan, 1.0f, 3.0f, nan, 3.0f};
  EXPECT_EQ(Sampler::SampleWithDraw(with_nan.data(), 5, greedy, 0.5, {}, {}),
            2);                         // NaN never wins; ties: lower id
  for (double u : {0.0, 0.5, 0.999}) {  // NaN counts as -inf: never drawn
    const int32_t t = Sampler::SampleWithDraw(with_nan.data(), 5, hot, u, {}, {});
    EXPECT_TRUE(t == 1 || t == 2 || t == 4) << t;
  }
  const std::vector<float> with_inf = {1.0f, inf, 2.0f, inf};
  EXPECT_EQ(Sampler::SampleWithDraw(with_inf.data(), 4, hot, 0.9, {}, {}),
            1);  // the first infinite logit
  const std::vector<float> none = {-inf, -inf, nan};
  EXPECT_EQ(Sampler::SampleWithDraw(none.data(), 3, hot, 0.3, {}, {}), 0);
  EXPECT_EQ(Sampler::SampleWithDraw(none.data(), 3, greedy, 0.3, {}, {}), 0);
  hot.temperature = 1e-38f;  // logits / temperature overflow: the best logit
  EXPECT_EQ(Sampler::SampleWithDraw(kLogits.data(), 5, hot, 0.7, {}, {}), 1);
}

TEST(SamplerTest, Penalties) {
  const std::vector<int32_t> prompt = {1};
  SamplingParams p;             // greedy
  p.repetition_penalty = 2.0f;  // token 1: 3.0 -> 1.5, below token 4 (2.9)
  EXPECT_EQ(Sampler(p).Sample(kLogits.data(), 5, 0, prompt, {}), 4);
  p.repetition_penalty = 1.0f;
  p.frequency_penalty = 0.06f;  // two 1s in the output: 3.0 - 0.12 < 2.9
  const std::vector<int32_t> out = {1, 1};
  EXPECT_EQ(Sampler(p).Sample(kLogits.data(), 5, 2, {}, out), 4);
  p.frequency_penalty = 0.0f;
  p.presence_penalty = 0.06f;  // once: 2.94 > 2.9
  EXPECT_EQ(Sampler(p).Sample(kLogits.data(), 5, 2, {}, out), 1);
  p.presence_penalty = 3.0f;
  EXPECT_EQ(p.Validate(5).code(), absl::StatusCode::kInvalidArgument);
  p.presence_penalty = 0.0f;
  p.repetition_penalty = 0.0f;
  EXPECT_EQ(p.Validate(5).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SamplerTest, TopLogprobs) {
  std::vector<TokenLogprob> top = Sampler::TopLogprobs(kLogits.data(), 5, 2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].id, 1);
  EXPECT_EQ(top[1].id, 4);
  double z = 0;
  for (float l : kLogits) z += std::exp(l);
  EXPECT_NEAR(top[0].logprob, 3.0 - std::log(z), 1e-6);
}

TEST(SamplerTest, ValidateRejectsImpossibleParams) {
  auto check = [](auto edit) {
    SamplingParams p;
    edit(p);
    return p.Validate(100).code();
  };
  EXPECT_EQ(check([](SamplingParams&) {}), absl::StatusCode::kOk);
  EXPECT_EQ(check([](SamplingParams& p) { p.temperature = -1; }),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check([](SamplingParams& p) { p.temperature = NAN; }),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check([](SamplingParams& p) { p.top_k = -2; }), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check([](SamplingParams& p) { p.top_p = 0; }), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check([](SamplingParams& p) { p.top_p = 1.5f; }), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check([](SamplingParams& p) { p.min_p = -0.1f; }), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(check([](SamplingParams& p) { p.top_logprobs = 101; }),
            absl::StatusCode::kInvalidArgument);
}

TEST(SamplerTest, ServedRequestsAskAtMostKMaxLogprobs) {
  SamplingParams p;
  p.top_logprobs = 100;  // the whole vocabulary: in-process callers (the goldens) may
  EXPECT_TRUE(p.Validate(100).ok());
  EXPECT_EQ(p.ValidateServed(100).code(), absl::StatusCode::kInvalidArgument);
  p.top_logprobs = kMaxLogprobs;
  EXPECT_TRUE(p.ValidateServed(100).ok());
  p.prompt_logprobs = kMaxLogprobs + 1;
  EXPECT_EQ(p.ValidateServed(100).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moesh
