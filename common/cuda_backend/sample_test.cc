// The GPU sampler (RunSample, rows from AppendSampleRow) against
// Sampler::SampleWithDraw on the same logits and draws: the same token on
// every row, except where the draw or a cut's mass lies within 1e-6 of a
// candidate boundary (fixed-point sums on the GPU, doubles on the CPU); such
// rows must be rare and must match the CPU with the draw/cut nudged.
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/cuda_backend/sample_rows.h"
#include "common/engine/sampler.h"
#include "gtest/gtest.h"
#include "kernels/cuda/routing.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::FreshSeed;
using testing::Poison;
using testing::Upload;

struct Row {
  SamplingParams params;
  double draw = 0.0;
  std::vector<int32_t> prompt, output;
};

SamplingParams Params(float temperature, int top_k, float top_p, float min_p, float rep = 1.0f,
                      float pres = 0.0f, float freq = 0.0f) {
  SamplingParams p;
  p.temperature = temperature, p.top_k = top_k, p.top_p = top_p, p.min_p = min_p;
  p.repetition_penalty = rep, p.presence_penalty = pres, p.frequency_penalty = freq;
  return p;
}

// Runs the rows through the GPU sampler (logits [rows, ld]).
absl::StatusOr<std::vector<int32_t>> SampleOnGpu(const std::vector<float>& logits, int vocab,
                                                 int ld, const std::vector<Row>& rows) {
  std::vector<SampleRow> srows;
  std::vector<PenaltyEntry> pens;
  for (const Row& r : rows) AppendSampleRow(r.params, r.draw, r.prompt, r.output, &srows, &pens);
  ASSIGN_OR_RETURN(auto dl, Upload(logits));
  ASSIGN_OR_RETURN(auto drows, DeviceBuffer<SampleRow>::Create(srows.size()));
  RETURN_IF_ERROR(drows.CopyFrom(srows));
  DeviceBuffer<PenaltyEntry> dpens;
  if (!pens.empty()) {
    ASSIGN_OR_RETURN(dpens, Upload(pens));
  }
  ASSIGN_OR_RETURN(auto dids, DeviceBuffer<int32_t>::Create(rows.size()));
  RETURN_IF_ERROR(Poison(dids));
  SampleParams p;
  p.logits = dl.get(), p.batch = static_cast<int>(rows.size()), p.vocab = vocab, p.ld = ld;
  p.rows = drows.get(), p.penalties = pens.empty() ? nullptr : dpens.get(), p.ids = dids.get();
  RETURN_IF_ERROR(RunSample(p));
  return dids.ToHost();
}

// True iff `id` is what the CPU picks with the draw and the top-p / min-p
// cuts nudged by up to 1e-6 (a boundary case, not a bug).
bool MatchesNudged(const float* logits, int vocab, const Row& r, int32_t id) {
  for (double du : {-1e-6, 0.0, 1e-6}) {
    for (float dp : {-1e-6f, 0.0f, 1e-6f}) {
      for (float dm : {-1e-6f, 0.0f, 1e-6f}) {
        SamplingParams p = r.params;
        p.top_p = std::min(1.0f, p.top_p + dp);
        if (p.min_p > 0.0f) p.min_p = std::clamp(p.min_p + dm, 0.0f, 1.0f);
        const double u = std::clamp(r.draw + du, 0.0, std::nextafter(1.0, 0.0));
        if (Sampler::SampleWithDraw(logits, vocab, p, u, r.prompt, r.output) == id) return true;
      }
    }
  }
  return false;
}

TEST(SampleTest, MatchesSamplerWithTheSameDraw) {
  MOESH_REQUIRE_GPU();
  const std::vector<SamplingParams> kinds = {
      Params(0.0f, 0, 1.0f, 0.0f),                    // greedy
      Params(0.0f, 0, 1.0f, 0.0f, 1.3f, 0.5f, 0.3f),  // greedy with penalties
      Params(1.0f, 0, 1.0f, 0.0f),                    // plain temperature
      Params(0.7f, 50, 1.0f, 0.0f),                   // top-k
      Params(1.0f, 1, 1.0f, 0.0f),                    // top-k 1
      Params(1.0f, 0, 0.9f, 0.0f),                    // top-p
      Params(1.3f, 0, 0.01f, 0.0f),                   // tiny top-p: the best token
      Params(0.8f, 0, 1.0f, 0.1f),                    // min-p
      Params(1.2f, 200, 0.95f, 0.05f),                // all three cuts
      Params(0.9f, 0, 0.8f, 0.0f, 1.2f, 0.4f, 0.2f),  // penalties and top-p
      Params(1.0f, 3000, 0.5f, 0.0f, 0.8f, -0.5f, 0.0f),
  };
  struct Case {
    int vocab, ld;
    float sigma;
    bool ties;  // logits on a grid of 0.5: many exact ties
  };
  const Case cases[] = {{102400, 0, 3.0f, false},  {102400, 102404, 1.0f, false},
                        {129280, 0, 8.0f, false},  {32000, 0, 2.0f, true},
                        {1000, 1003, 0.5f, false}, {1000, 0, 1.0f, true},
                        {7, 0, 1.0f, false},       {1, 0, 1.0f, false}};
  int rows_total = 0, boundary = 0;
  for (const Case& c : cases) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << "vocab=" << c.vocab << " sigma=" << c.sigma
                                      << " ties=" << c.ties << " seed=" << seed);
    std::mt19937 rng(seed);
    const int ld = c.ld ? c.ld : c.vocab;
    const int reps = c.vocab >= 100000 ? 3 : 8;
    std::vector<Row> rows;
    for (int rep = 0; rep < reps; ++rep) {
      for (const SamplingParams& k : kinds) {
        Row r;
        r.params = k;
        if (r.params.top_k >= c.vocab) r.params.top_k = 0;
        r.draw = std::uniform_real_distribution<double>(0.0, 1.0)(rng);
        std::uniform_int_distribution<int32_t> tok(0, c.vocab - 1);
        for (int i = 0; i < 40; ++i) r.prompt.push_back(tok(rng));
        for (int i = 0; i < 25; ++i)
          r.output.push_back(i % 3 == 0 && i > 0 ? r.output[i - 1] : tok(rng));
        rows.push_back(std::move(r));
      }
    }
    std::shuffle(rows.begin(), rows.end(), rng);
    std::vector<float> logits(rows.size() * ld, std::nanf(""));  // padding columns must not be read
    std::normal_distribution<float> normal(0.0f, c.sigma);
    for (size_t b = 0; b < rows.size(); ++b) {
      for (int i = 0; i < c.vocab; ++i) {
        const float x = normal(rng);
        logits[b * ld + i] = c.ties ? std::round(x * 2.0f) / 2.0f : x;
      }
    }
    // Non-finite rows: NaN logits (count as -inf), a +inf logit, -inf everywhere, and a temperature
    // so small that logits / temperature overflow.
    if (c.vocab >= 7) {
      std::uniform_int_distribution<int> pos(0, c.vocab - 1);
      for (int j = 0; j < 3; ++j) logits[0 * ld + pos(rng)] = std::nanf("");
      logits[1 * ld + pos(rng)] = std::numeric_limits<float>::infinity();
      for (int i = 0; i < c.vocab; ++i)
        logits[2 * ld + i] = -std::numeric_limits<float>::infinity();
      rows[3].params.temperature = 1e-38f;
    }
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<int32_t> ids, SampleOnGpu(logits, c.vocab, ld, rows));
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<int32_t> again, SampleOnGpu(logits, c.vocab, ld, rows));
    EXPECT_EQ(ids, again) << "the GPU sampler is not deterministic";
    for (size_t b = 0; b < rows.size(); ++b) {
      const float* row = logits.data() + b * ld;
      const Row& r = rows[b];
      const int32_t want =
          Sampler::SampleWithDraw(row, c.vocab, r.params, r.draw, r.prompt, r.output);
      ++rows_total;
      if (ids[b] == want) continue;
      const SamplingParams& p = r.params;
      ASSERT_TRUE(MatchesNudged(row, c.vocab, r, ids[b]))
          << "row " << b << ": GPU " << ids[b] << ", CPU " << want << " (T " << p.temperature
          << ", top_k " << p.top_k << ", top_p " << p.top_p << ", min_p " << p.min_p << ", rep "
          << p.repetition_penalty << ", draw " << r.draw << ")";
      ++boundary;
    }
  }
  std::printf("%d rows, %d boundary cases\n", rows_total, boundary);
  EXPECT_LE(boundary * 100, rows_total)
      << "boundary cases should be rare (draws within 1e-6 of a boundary)";
}

TEST(SampleTest, RejectsBadShapes) {
  SampleParams p;
  p.batch = 1, p.vocab = 0;
  EXPECT_EQ(RunSample(p).code(), absl::StatusCode::kInvalidArgument);
  p.vocab = 10, p.ld = 5;
  EXPECT_EQ(RunSample(p).code(), absl::StatusCode::kInvalidArgument);
  p.ld = 0;  // null pointers
  EXPECT_EQ(RunSample(p).code(), absl::StatusCode::kInvalidArgument);
}

// Greedy/top-k log-probabilities (RunGreedyLogprobs) against
// Sampler::TopLogprobs: the same ids, log-probabilities within fp32 rounding.
TEST(GreedyLogprobsTest, MatchesSamplerTopLogprobs) {
  MOESH_REQUIRE_GPU();
  struct Case {
    int batch, vocab, ld, top_k;
  };
  for (const Case c : {Case{5, 102400, 0, 20}, Case{3, 129280, 0, 0}, Case{4, 1001, 1003, 7},
                       Case{2, 50, 0, 20}, Case{1, 32000, 32004, 1}}) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "vocab=" << c.vocab << " top_k=" << c.top_k << " seed=" << seed);
    std::mt19937 rng(seed);
    const int ld = c.ld ? c.ld : c.vocab;
    std::vector<float> logits = testing::Randn(static_cast<size_t>(c.batch) * ld, rng, 3.0f);
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
      const std::vector<TokenLogprob> ref =
          Sampler::TopLogprobs(row, c.vocab, std::max(c.top_k, 1));
      EXPECT_EQ(next[b], ref[0].id) << "row " << b;
      EXPECT_NEAR(next_lp[b], ref[0].logprob, 2e-5f) << "row " << b;
      for (int k = 0; k < c.top_k; ++k) {
        EXPECT_EQ(ids[static_cast<size_t>(b) * c.top_k + k], ref[k].id)
            << "row " << b << " rank " << k;
        EXPECT_NEAR(lps[static_cast<size_t>(b) * c.top_k + k], ref[k].logprob, 2e-5f)
            << "row " << b << " rank " << k;
      }
    }
  }
}

}  // namespace
}  // namespace moesh::cuda
