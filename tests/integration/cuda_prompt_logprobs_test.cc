// Prompt log-probabilities on the GPU (CudaAttentionBackend::
// ForwardAllPositions, CudaModel::ForwardAllLogits: the final norm and
// lm_head over every new position) against the CPU engine, on the golden
// checkpoints V3, V2-Lite, V3.2 and V4:
//   * a batch of prompts through ForwardSample with prompt_logprobs: the same
//     layout (n - 1 entries of k alternatives each) and log-probabilities
//     within bf16's tolerance of the CPU backend's (mean and max |Δlogprob|
//     printed), the top alternatives' values too, their ids but at near-ties;
//     the next decode step from the caches that pass wrote agrees as well;
//   * ForwardAllPositions' rows are laid out sequence by sequence: each
//     sequence's last row is Forward's logits, and a decode-shaped pass (one
//     token a sequence, padded to a graph bucket) returns its real rows only;
// and, on a random model of a large vocabulary, lm_head in row chunks
// (CudaModel::all_position_rows) over two prefill passes gives the rows at
// the chunks' and passes' edges that a second model computes as the last
// rows of pieces of the prompt.
// Skips (with a message) where no GPU is present (cudaGetDeviceCount's no
// driver / no device); MOESH_REQUIRE_CUDA=1 fails instead.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "common/backend/backends.h"
#include "common/cuda_backend/cuda_model.h"
#include "common/cuda_backend/model_test_util.h"
#include "common/engine/attention_backend.h"
#include "common/engine/sampler.h"
#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::kIndexerNearTies;
using testing::kLogprobTolerance;
using testing::kNearTieBound;
using testing::kV4LogprobTolerance;
using testing::LogSoftmax;
using testing::MaxDiff;

// cuda_model_test's bounds for the same goldens (model_test_util.h): at
// most kIndexerNearTies positions a run beyond the family's bound, by at
// most kNearTieBound (the lightning indexer's near-ties: V3.2, V4's CSA).
// The same device's two paths (lm_head over other row counts): fp32 logits
// of the same bf16 rows.
constexpr double kSameDeviceTolerance = 1e-3;

DeviceOptions Cuda() {
  DeviceOptions o;
  o.device = "cuda";
  o.gpu_memory_utilization = 0.5;
  o.max_num_seqs = 4;
  o.max_model_len = 64;
  return o;
}

// The golden prompts: no longer than V3.2's index_topk (8) keeps its indexer
// choosing every key, so only V4's compressed layers may see a near-tie.
std::vector<std::vector<int32_t>> Prompts(int vocab) {
  std::vector<std::vector<int32_t>> p = {{5, 17, 300, 42, 9, 100}, {1, 2, 3, 4, 5, 6, 7, 8}, {400}};
  for (auto& s : p)
    for (int32_t& t : s) t %= vocab;
  return p;
}

struct Deltas {
  double sum = 0, max = 0;
  int count = 0, beyond = 0;
  void Add(double d, double tolerance) {
    sum += d, max = std::max(max, d), ++count;
    beyond += d > tolerance;
  }
  double mean() const { return count > 0 ? sum / count : 0.0; }
};

class CudaPromptLogprobsTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Goldens, CudaPromptLogprobsTest,
                         ::testing::Values("v3", "v2_lite", "v32", "v4"));

TEST_P(CudaPromptLogprobsTest, MatchesTheCpuEngine) {
  MOESH_REQUIRE_GPU();
  const std::string dir = testing::GoldenDir(GetParam());
  MOESH_ASSERT_OK_AND_ASSIGN(testing::CheckedCheckpoint m, testing::OpenChecked(dir));
  const int vocab = m.config.vocab_size;
  const double tolerance =
      m.config.family == ModelFamily::kDeepseekV4 ? kV4LogprobTolerance : kLogprobTolerance;
  MOESH_ASSERT_OK_AND_ASSIGN(testing::CpuEngine cpu_engine, testing::LoadCpu(dir));
  std::unique_ptr<AttentionBackend> cpu = NewCpuAttentionBackend(cpu_engine.model.get(), 0, 64);
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> gpu,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), true));
  EXPECT_TRUE(gpu->has_all_position_logits());
  MOESH_ASSERT_OK(CheckPrompt(*gpu, {1, 2}, 3));

  const std::vector<std::vector<int32_t>> prompts = Prompts(vocab);
  SamplingParams greedy;
  greedy.logprobs = true;
  const int k = 3;
  std::vector<std::unique_ptr<KvSequence>> sc, sg;
  std::vector<SequenceInput> ic, ig;
  std::vector<SampleRequest> samples;
  for (const auto& p : prompts) {
    sc.push_back(*cpu->NewSequence(32));
    sg.push_back(*gpu->NewSequence(32));
    ic.push_back({p, sc.back().get()});
    ig.push_back({p, sg.back().get()});
    samples.push_back({&greedy, 0.0, p, {}, k});
  }
  MOESH_ASSERT_OK_AND_ASSIGN(SampledTokens want,
                             cpu->ForwardSample(ic, cpu_engine.experts.get(), samples, 2));
  MOESH_ASSERT_OK_AND_ASSIGN(SampledTokens got, gpu->ForwardSample(ig, nullptr, samples, 2));
  ASSERT_EQ(got.prompt_logprobs.size(), prompts.size());
  Deltas lp, top;
  int id_swaps = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const PromptLogprobs &g = got.prompt_logprobs[i], &w = want.prompt_logprobs[i];
    ASSERT_EQ(g.logprobs.size(), prompts[i].size() - 1) << "prompt " << i;
    ASSERT_EQ(w.logprobs.size(), g.logprobs.size());
    ASSERT_EQ(g.top.size(), g.logprobs.size());
    for (size_t t = 0; t < g.logprobs.size(); ++t) {
      lp.Add(std::fabs(g.logprobs[t] - w.logprobs[t]), tolerance);
      ASSERT_EQ(g.top[t].size(), static_cast<size_t>(k));
      for (int j = 0; j < k; ++j) {
        // The j-th largest value moves by at most the largest |Δ| of any entry.
        top.Add(std::fabs(g.top[t][j].logprob - w.top[t][j].logprob), tolerance);
        if (g.top[t][j].id == w.top[t][j].id) continue;
        ++id_swaps;  // only where the CPU's neighbours lie within the bound
        const float next = j + 1 < k ? w.top[t][j + 1].logprob : -INFINITY;
        const float prev = j > 0 ? w.top[t][j - 1].logprob : INFINITY;
        EXPECT_LE(std::min(prev - w.top[t][j].logprob, w.top[t][j].logprob - next),
                  2 * kNearTieBound)
            << "prompt " << i << " position " << t << " alternative " << j;
      }
    }
  }
  std::printf(
      "%s: prompt logprobs over %d positions: mean |dlogprob| %.3e, max %.3e (bound %.0e); "
      "top-%d values max %.3e; %d alternative ids swapped\n",
      GetParam().c_str(), lp.count, lp.mean(), lp.max, tolerance, k, top.max, id_swaps);
  EXPECT_GT(lp.count, 10);
  EXPECT_LE(lp.mean(), tolerance / 2);
  EXPECT_LE(lp.beyond + top.beyond / k, kIndexerNearTies);
  EXPECT_LE(lp.max, kNearTieBound);
  EXPECT_LE(top.max, kNearTieBound);
  // The rest of ForwardSample as the CPU's: the tokens, their own logprobs.
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_NEAR(got.logprobs[i], want.logprobs[i], kNearTieBound) << "prompt " << i;
    ASSERT_EQ(got.top_logprobs[i].size(), 2u);
  }

  // The caches the all-positions pass wrote: the next (decode) step agrees.
  std::vector<std::vector<int32_t>> next(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    next[i] = {want.ids[i]};
    ic[i].tokens = next[i], ig[i].tokens = next[i];
  }
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> lc, cpu->Forward(ic, cpu_engine.experts.get()));
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> lg, gpu->Forward(ig, nullptr));
  ASSERT_EQ(lc.size(), lg.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const double d =
        MaxDiff(LogSoftmax(lg.data() + i * vocab, vocab), LogSoftmax(lc.data() + i * vocab, vocab));
    EXPECT_LE(d, kNearTieBound) << "decode after the prompt pass, sequence " << i;
  }
}

TEST_P(CudaPromptLogprobsTest, RowsAreEachSequencesPositions) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(testing::CheckedCheckpoint m,
                             testing::OpenChecked(testing::GoldenDir(GetParam())));
  const int vocab = m.config.vocab_size;
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> all,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), true));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> last,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), true));
  const std::vector<std::vector<int32_t>> prompts = Prompts(vocab);
  std::vector<std::unique_ptr<KvSequence>> sa, sl;
  std::vector<SequenceInput> ia, il;
  for (const auto& p : prompts) {
    sa.push_back(*all->NewSequence(32));
    sl.push_back(*last->NewSequence(32));
    ia.push_back({p, sa.back().get()});
    il.push_back({p, sl.back().get()});
  }
  double worst = 0;
  for (int pass = 0; pass < 2; ++pass) {  // the prompts, then one token each (a decode pass)
    size_t total = 0;
    for (const SequenceInput& in : ia) total += in.tokens.size();
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> rows, all->ForwardAllPositions(ia, nullptr));
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> lasts, last->Forward(il, nullptr));
    ASSERT_EQ(rows.size(), total * vocab) << "pass " << pass;
    size_t row = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      row += ia[i].tokens.size();
      const double d = MaxDiff(LogSoftmax(rows.data() + (row - 1) * vocab, vocab),
                               LogSoftmax(lasts.data() + i * vocab, vocab));
      worst = std::max(worst, d);
      EXPECT_LE(d, kSameDeviceTolerance) << "pass " << pass << " sequence " << i;
      EXPECT_EQ(sa[i]->length(), sl[i]->length());
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      ia[i].tokens = il[i].tokens = absl::MakeConstSpan(prompts[i].data(), 1);
    }
  }
  std::printf("%s: all positions' last rows vs Forward: max |dlogprob| %.3e\n", GetParam().c_str(),
              worst);
}

// lm_head in chunks of all_position_rows() rows and prefill passes of
// max_tokens_per_step tokens: the rows at and around every chunk's and
// pass's edges as a second model computes them as the last rows of pieces
// of the same prompt (prefill passes of other lengths).
TEST(CudaPromptLogprobsChunksTest, ChunkedHeadGivesEveryRow) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(ModelConfig c, PresetConfig("v3", "tiny"));
  c.vocab_size = 200000;  // 800 KB of fp32 logits a row: 335 rows a chunk
  const int n = 1000;     // chunks [0, 335), [335, 670), [670, 800) of pass 1, pass 2 [800, n)
  ASSERT_GE(c.max_position_embeddings, n);
  CudaModelOptions o;
  o.max_num_seqs = 2;
  o.max_model_len = 1024;
  o.max_kv_blocks = 40;  // b: two sequences of n tokens
  o.max_tokens_per_step = 800;
  o.gpu_memory_utilization = 0.5;
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaModel> a, CudaModel::Dummy(c, 3, o));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaModel> b, CudaModel::Dummy(c, 3, o));
  const int rows = a->all_position_rows();
  ASSERT_EQ(rows, static_cast<int>(CudaModel::kAllPositionLogitBytes / (c.vocab_size * 4)));
  ASSERT_EQ(rows, 335);
  std::vector<int32_t> prompt(n);
  for (int i = 0; i < n; ++i) prompt[i] = (i * 7919 + 13) % c.vocab_size;
  MOESH_ASSERT_OK_AND_ASSIGN(const int sa, a->AddSequence(n));
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> got, a->ForwardAllLogits({{sa, prompt}}));
  ASSERT_EQ(got.size(), static_cast<size_t>(n) * c.vocab_size);
  MOESH_ASSERT_OK_AND_ASSIGN(const int len, a->SequenceLength(sa));
  EXPECT_EQ(len, n);
  // Two of b's sequences, pieces of at least two tokens (a one-token piece
  // would be a decode pass, other attention kernels) ending after the rows
  // on either side of each edge.
  double worst = 0;
  for (const std::vector<int>& ends : {std::vector<int>{2, rows, 2 * rows, 800, n},
                                       std::vector<int>{rows + 1, 2 * rows + 1, 801, n - 1}}) {
    MOESH_ASSERT_OK_AND_ASSIGN(const int sb, b->AddSequence(n));
    int from = 0;
    for (int end : ends) {
      const absl::Span<const int32_t> piece(prompt.data() + from, end - from);
      MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> want, b->ForwardLogits({{sb, piece}}));
      const size_t t = end - 1;
      const double d = MaxDiff(LogSoftmax(got.data() + t * c.vocab_size, c.vocab_size),
                               LogSoftmax(want.data(), c.vocab_size));
      worst = std::max(worst, d);
      // Other passes (their MoE tiles differ): bf16's bound; a misplaced row is O(1) off.
      EXPECT_LE(d, kLogprobTolerance) << "row " << t;
      from = end;
    }
  }
  std::printf("%d rows in lm_head chunks of %d vs pieces' last rows: max |dlogprob| %.3e\n", n,
              rows, worst);
}

}  // namespace
}  // namespace moesh::cuda
