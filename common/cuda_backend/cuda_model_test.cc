// The CUDA forward pass end to end against the CPU engine (which matches
// transformers within 1.5e-6):
//   * the golden checkpoints (tests/golden/{v2_lite,v2,v3,v3_neox,v4,v4_legacy},
//     made by transformers): the three prompts batched together, prefill in
//     chunks, then 16 greedy steps. Teacher-forced with the golden tokens,
//     every step's log-probabilities (all of the vocabulary) must be within
//     2e-2 (V4: 5e-2, see below) of the CPU engine's on the same bf16-rounded
//     weights (Bf16Copy), and the greedy token must be transformers' (or the
//     CPU engine's on those weights). Two
//     exceptions, each counted and printed: a decode step whose routed experts
//     differ from the CPU engine's (a near-tie of the router: a discrete choice
//     that bf16 activations can flip), and a greedy token that differs where
//     transformers' own top-2 margin is under kPrecisionTie. Free-running
//     through Step (CUDA graphs), the tokens must equal transformers' up to
//     such a tie, with the same log-probabilities as the teacher-forced pass.
//   * random checkpoints with DeepSeek's real attention widths (latent 512,
//     rope 64, 16 heads; V3 also with its 128), which take the tuned MLA
//     kernels (16 and 64 heads per CTA) and the split plan,
//     and the same model with the plain MLA kernel: logits within bf16's
//     relative error of the CPU engine's and of each other (bounds below).
// Skips (with a message) where no GPU is present.
#include "common/cuda_backend/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/file_util.h"
#include "common/cuda_backend/model_test_util.h"
#include "common/model/attention_model.h"
#include "common/model/expert_client.h"
#include "common/model/model.h"
#include "common/model/random_checkpoint.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"
#include "nlohmann/json.hpp"

namespace moesh::cuda {
namespace {

using testing::Argmax;
using testing::CpuEngine;
using testing::CpuStep;
using testing::kIndexerNearTies;
using testing::kLogprobTolerance;
using testing::kNearTieBound;
using testing::kV4LogprobTolerance;
using testing::LoadCpu;
using testing::LogSoftmax;
using testing::MaxDiff;
using testing::RelLogitErr;

// Greedy tokens whose transformers top-2 margin is under this are a tie at
// bf16's precision: either token may come out.
constexpr double kPrecisionTie = 1e-2;

// WriteBf16RoundedCopy's copy of the checkpoint in `dir` (under the test's
// temporary directory): against the CPU engine on it, the GPU's differences
// are its own (bf16 activations), not the checkpoint's rounding. The V4
// goldens are fp32, and rounding their weights alone moves the CPU engine's
// log-probabilities by up to 0.21 at the indexer's near-ties
// (tests/golden/bf16_drift.cc measures it).
absl::StatusOr<std::string> Bf16Copy(const std::string& dir) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string out = JoinPath(tmp != nullptr ? tmp : "/tmp",
                                   "moesh_bf16_" + std::to_string(std::hash<std::string>()(dir)));
  RETURN_IF_ERROR(WriteBf16RoundedCopy(dir, out));
  return out;
}

// True iff row `row` of the GPU's routing (LastRouting) picked the same
// experts as the CPU engine's last single-token dispatch, in every MoE layer.
bool SameRouting(const CpuEngine& cpu, const std::vector<int32_t>& gpu, int rows, int row,
                 int top_k) {
  for (const auto& [layer, ids] : cpu.experts->ids) {
    std::set<int32_t> a(ids.begin(), ids.end());
    const int32_t* g = &gpu[(static_cast<size_t>(layer) * rows + row) * top_k];
    if (a != std::set<int32_t>(g, g + top_k)) return false;
  }
  return true;
}

// DeepSeek-V3.2 past index_topk: the indexer picks among the causal rows on
// the GPU (dsa_ops.h) and the MLA kernel reads its selection. The golden's
// model is a chaotic one at bf16: rounding its fp32 tensors as the GPU does
// moves the CPU engine's own log-probabilities by up to 0.44 at some
// steps (indexer and router near-ties; tests/golden/bf16_drift.cc), so it
// is not in CudaGoldenTest.
// Here each golden prompt (two of the three are longer than index_topk) is
// teacher-forced with the CPU engine's greedy tokens, on the same bf16
// weights, for 12 steps or until the first routing flip or the first step
// over the tolerance (a near-tie of the indexer: a flipped selection then
// changes every later layer's rows). At least 12 steps past index_topk must
// match, and at most one prompt may end at a near-tie (measured: the 5- and
// 19-token prompts match through 8 and 12 steps; the 45-token prompt's
// prefill ends at 0.29). The selection itself is dsa_ops_test's, exactly
// against the CPU indexer.
TEST(CudaModelTest, V32SparseAttentionMatchesCpuEngine) {
  MOESH_REQUIRE_GPU();
  const std::string dir = testing::GoldenDir("v32");
  absl::StatusOr<std::string> rounded = Bf16Copy(dir);
  ASSERT_TRUE(rounded.ok()) << rounded.status();
  absl::StatusOr<CpuEngine> cpu = LoadCpu(*rounded);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<std::string> text = ReadFileToString(JoinPath(dir, "golden.json"));
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json golden = nlohmann::json::parse(*text);
  CudaModelOptions options;
  options.max_num_seqs = 2;
  options.max_kv_blocks = 16;
  options.record_routing = true;
  absl::StatusOr<std::unique_ptr<CudaModel>> gpu = CudaModel::Load(dir, options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const ModelConfig& c = (*gpu)->config();
  const int vocab = c.vocab_size, top_k = c.num_experts_per_tok;
  int compared = 0, beyond = 0,
      near_ties = 0;  // steps matched; of them past index_topk; prompts ended at a near-tie
  for (size_t p = 0; p < golden["prompts"].size(); ++p) {
    absl::StatusOr<int> id = (*gpu)->AddSequence();
    ASSERT_TRUE(id.ok()) << id.status();
    SequenceKvCache cache = cpu->model->NewCache();
    std::vector<int32_t> input = golden["prompts"][p].get<std::vector<int32_t>>();
    int length = 0;
    for (int s = 0; s < 12; ++s) {
      SCOPED_TRACE(::testing::Message() << "prompt " << p << " step " << s);
      const SequenceTokens batch[] = {{*id, input}};
      absl::StatusOr<std::vector<float>> logits = (*gpu)->ForwardLogits(batch);
      ASSERT_TRUE(logits.ok()) << logits.status();
      int rows = 0;
      absl::StatusOr<std::vector<int32_t>> routing = (*gpu)->LastRouting(&rows);
      ASSERT_TRUE(routing.ok()) << routing.status();
      const std::vector<float> cl = CpuStep(*cpu, &cache, input);
      ASSERT_EQ(cl.size(), static_cast<size_t>(vocab));
      const double d = MaxDiff(LogSoftmax(logits->data(), vocab), LogSoftmax(cl.data(), vocab));
      length += static_cast<int>(input.size());
      input = {Argmax(cl.data(), vocab)};
      if (s > 0 && !SameRouting(*cpu, *routing, rows, 0, top_k)) {
        std::printf(
            "  v32 prompt %zu step %d: routed experts differ from the CPU engine's (router "
            "near-tie); max "
            "|logprob diff| %.3e; comparison ends\n",
            p, s, d);
        break;
      }
      if (d > kLogprobTolerance) {
        ++near_ties;
        std::printf(
            "  v32 prompt %zu step %d (%d tokens): max |logprob diff| %.3e (an indexer near-tie); "
            "comparison ends\n",
            p, s, length, d);
        break;
      }
      ++compared;
      beyond += length > c.indexer.topk;
    }
  }
  std::printf(
      "v32: %d steps within %.0e of the CPU engine, %d of them past index_topk (%d); %d prompts "
      "ended at "
      "a near-tie\n",
      compared, kLogprobTolerance, beyond, c.indexer.topk, near_ties);
  EXPECT_GE(beyond, 12) << "the CUDA model left the CPU engine within a few steps past index_topk";
  EXPECT_LE(near_ties, 1);
}

class CudaGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaGoldenTest, MatchesTransformersAndCpuEngine) {
  MOESH_REQUIRE_GPU();
  const std::string dir = testing::GoldenDir(GetParam());
  absl::StatusOr<std::string> text = ReadFileToString(JoinPath(dir, "golden.json"));
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json golden = nlohmann::json::parse(*text);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> hf_file =
      SafetensorsFile::Open(JoinPath(dir, "golden_logits.safetensors"));
  ASSERT_TRUE(hf_file.ok()) << hf_file.status();
  absl::StatusOr<std::string> rounded = Bf16Copy(dir);
  ASSERT_TRUE(rounded.ok()) << rounded.status();
  absl::StatusOr<CpuEngine> cpu = LoadCpu(*rounded);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  CudaModelOptions options;
  options.max_num_seqs = 4;
  options.max_kv_blocks = 64;
  options.max_tokens_per_step = 32;  // the 69 prompt tokens run in three chunks
  options.record_routing = true;
  absl::StatusOr<std::unique_ptr<CudaModel>> gpu = CudaModel::Load(dir, options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const ModelConfig& c = (*gpu)->config();
  const int vocab = c.vocab_size, top_k = c.num_experts_per_tok;

  const size_t n = golden["prompts"].size();
  ASSERT_EQ(n, 3u);
  std::vector<std::vector<int32_t>> prompts(n), want(n);
  std::vector<const float*> hf(n);
  for (size_t p = 0; p < n; ++p) {
    prompts[p] = golden["prompts"][p].get<std::vector<int32_t>>();
    want[p] = golden["output_ids"][p].get<std::vector<int32_t>>();
    const TensorView& t = (*hf_file)->tensors().at("logits_" + std::to_string(p));
    ASSERT_EQ(t.shape, (std::vector<int64_t>{static_cast<int64_t>(want[p].size()), vocab}));
    hf[p] = reinterpret_cast<const float*>(t.data);
  }
  const int steps = static_cast<int>(want[0].size());
  auto hf_margin = [&](size_t p, int s) {
    std::vector<float> row(hf[p] + static_cast<size_t>(s) * vocab,
                           hf[p] + static_cast<size_t>(s + 1) * vocab);
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
    return static_cast<double>(row[0] - row[1]);
  };

  // Teacher-forced: the golden tokens go in; every step's distribution is compared.
  std::vector<int> seq(n);
  std::vector<SequenceKvCache> caches;
  for (size_t p = 0; p < n; ++p) {
    absl::StatusOr<int> id = (*gpu)->AddSequence();
    ASSERT_TRUE(id.ok()) << id.status();
    seq[p] = *id;
    caches.push_back(cpu->model->NewCache());
  }
  double worst_cpu = 0.0, worst_hf = 0.0;
  int routing_flips = 0, ties = 0, indexer_ties = 0;
  std::set<std::pair<size_t, int>> tie_steps;
  std::vector<std::vector<double>> golden_lp(n);  // the GPU's log-probability of each golden token
  std::vector<std::vector<int32_t>> inputs = prompts;
  for (int s = 0; s < steps; ++s) {
    std::vector<SequenceTokens> batch;
    for (size_t p = 0; p < n; ++p) batch.push_back({seq[p], inputs[p]});
    absl::StatusOr<std::vector<float>> logits = (*gpu)->ForwardLogits(batch);
    ASSERT_TRUE(logits.ok()) << logits.status();
    int rows = 0;
    absl::StatusOr<std::vector<int32_t>> routing = (*gpu)->LastRouting(&rows);
    ASSERT_TRUE(routing.ok()) << routing.status();
    for (size_t p = 0; p < n; ++p) {
      SCOPED_TRACE(::testing::Message() << "prompt " << p << " step " << s);
      const float* g = logits->data() + p * vocab;
      const std::vector<float> cl = CpuStep(*cpu, &caches[p], inputs[p]);
      ASSERT_EQ(cl.size(), static_cast<size_t>(vocab));
      const std::vector<double> lg = LogSoftmax(g, vocab);
      const double d_cpu = MaxDiff(lg, LogSoftmax(cl.data(), vocab));
      const double d_hf = MaxDiff(lg, LogSoftmax(hf[p] + static_cast<size_t>(s) * vocab, vocab));
      golden_lp[p].push_back(lg[want[p][s]]);
      // Decode steps (one token per sequence) can be checked for routing flips.
      const bool flipped = s > 0 && !SameRouting(*cpu, *routing, rows, static_cast<int>(p), top_k);
      const double tolerance =
          c.layers() == LayerArch::kV4 ? kV4LogprobTolerance : kLogprobTolerance;
      bool indexer_tie = false;
      if (flipped) {
        ++routing_flips;
        std::printf(
            "  %s prompt %zu step %d: routed experts differ from the CPU engine's (router "
            "near-tie); "
            "max |logprob diff| %.3e\n",
            GetParam().c_str(), p, s, d_cpu);
      } else if ((c.layers() == LayerArch::kV4 || c.has_indexer()) && d_cpu > tolerance &&
                 d_cpu <= kNearTieBound && indexer_ties < kIndexerNearTies) {
        ++indexer_ties;
        indexer_tie = true;
        std::printf(
            "  %s prompt %zu step %d: max |logprob diff| %.3e (a near-tie of the CSA indexer's "
            "top-k)\n",
            GetParam().c_str(), p, s, d_cpu);
      } else {
        EXPECT_LE(d_cpu, tolerance);
        worst_cpu = std::max(worst_cpu, d_cpu);
        worst_hf = std::max(worst_hf, d_hf);
      }
      const int top = Argmax(g, vocab);
      if (top != want[p][s]) {
        const double margin = hf_margin(p, s);
        if (margin < kPrecisionTie || indexer_tie) {
          ++ties;
          tie_steps.insert({p, s});
          std::printf(
              "  %s prompt %zu step %d: greedy %d, transformers %d with top-2 margin %.2e (a tie "
              "at "
              "bf16 precision)\n",
              GetParam().c_str(), p, s, top, want[p][s], margin);
        } else if (top == Argmax(cl.data(), vocab)) {
          ++ties;
          tie_steps.insert({p, s});
          std::printf(
              "  %s prompt %zu step %d: greedy %d, transformers %d (top-2 margin %.2e), as the CPU "
              "engine "
              "on the bf16 weights picks\n",
              GetParam().c_str(), p, s, top, want[p][s], margin);
        } else {
          ADD_FAILURE() << "greedy " << top << " != transformers' " << want[p][s]
                        << " (top-2 margin " << margin << ")";
        }
      }
      inputs[p] = {want[p][s]};
    }
  }

  // Free-running greedy through Step: prefill, then decode steps replaying
  // graphs. Identical inputs give identical numbers, so the tokens follow
  // transformers' until a tie found above, if any.
  std::vector<int> seq2(n);
  for (size_t p = 0; p < n; ++p) {
    absl::StatusOr<int> id = (*gpu)->AddSequence();
    ASSERT_TRUE(id.ok()) << id.status();
    seq2[p] = *id;
  }
  std::vector<std::vector<int32_t>> got(n);
  std::vector<std::vector<float>> got_lp(n);
  inputs = prompts;
  bool replayed = false;
  for (int s = 0; s < steps; ++s) {
    std::vector<SequenceTokens> batch;
    for (size_t p = 0; p < n; ++p) batch.push_back({seq2[p], inputs[p]});
    absl::StatusOr<StepOutput> out = (*gpu)->Step(batch, /*top_logprobs=*/5);
    ASSERT_TRUE(out.ok()) << out.status();
    replayed = replayed || (*gpu)->last_step_used_graph();
    for (size_t p = 0; p < n; ++p) {
      got[p].push_back(out->next_ids[p]);
      got_lp[p].push_back(out->next_logprobs[p]);
      EXPECT_EQ(out->topk_ids[p * 5], out->next_ids[p]);
      EXPECT_FLOAT_EQ(out->topk_logprobs[p * 5], out->next_logprobs[p]);
      inputs[p] = {out->next_ids[p]};
    }
  }
  EXPECT_TRUE(replayed) << "no decode step replayed a CUDA graph";
  for (size_t p = 0; p < n; ++p) {
    SCOPED_TRACE(::testing::Message() << "prompt " << p);
    int s = 0;
    while (s < steps && got[p][s] == want[p][s]) {
      EXPECT_NEAR(got_lp[p][s], golden_lp[p][s], 1e-4)
          << "step " << s << ": Step and ForwardLogits disagree";
      ++s;
    }
    if (s < steps) {
      EXPECT_TRUE(tie_steps.count({p, s})) << "free-running tokens leave transformers' at step "
                                           << s << " where the teacher-forced pass found no tie";
      std::printf(
          "  %s prompt %zu: free-running tokens follow transformers' for %d of %d steps (then the "
          "tie)\n",
          GetParam().c_str(), p, s, steps);
    }
  }
  std::printf(
      "%s: max |logprob - CPU engine| %.2e, - transformers %.2e (tolerance %.0e); routing flips "
      "%d, "
      "indexer near-ties %d, greedy ties %d\n",
      GetParam().c_str(), worst_cpu, worst_hf,
      c.layers() == LayerArch::kV4 ? kV4LogprobTolerance : kLogprobTolerance, routing_flips,
      indexer_ties, ties);
}

INSTANTIATE_TEST_SUITE_P(Goldens, CudaGoldenTest,
                         ::testing::Values("v2_lite", "v2", "v3", "v3_neox", "v4", "v4_legacy"));

// DeepSeek's real attention widths on a small random model: the tuned MLA
// decode kernel (latent 512 + rope 64) and its split plan, against the plain
// kernel and the CPU engine; 16-, 32- and 64-row expert tiles; prefill across
// cache blocks. Every token goes to every expert, so no router near-tie can
// flip a choice and the comparison measures arithmetic alone.
// Measured on the H200 (NOTES.md): 1.7e-2 to 2.3e-2 against the CPU engine
// for both kernels, and 1.0e-2 to 1.3e-2 between them. This random model
// amplifies rounding: the tuned kernel's bf16 probabilities alone move its
// logits by 1e-2 of their spread. A wrong rope, scale or head mapping moves
// them by far more than these bounds.
constexpr double kRealWidthsTolerance = 5e-2;
constexpr double kKernelPairTolerance = 3e-2;

class CudaRealWidthsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaRealWidthsTest, MatchesCpuEngine) {
  MOESH_REQUIRE_GPU();
  // "v3-wide": V3 with its real 128 heads, which take the 64-head wgmma kernel.
  const bool wide = GetParam() == "v3-wide";
  absl::StatusOr<ModelConfig> config = PresetConfig(wide ? "v3" : GetParam(), "small");
  ASSERT_TRUE(config.ok()) << config.status();
  ModelConfig& c = *config;
  if (c.layers() == LayerArch::kV4) {  // head_dim 512: attention on the tuned MLA kernel
    c = testing::V4RealWidths(/*moe_intermediate=*/128);
  } else {
    c.vocab_size = 2048;
    c.hidden_size = 1024;
    c.intermediate_size = 1024;
    c.moe_intermediate_size = 256;
    c.num_hidden_layers = 2;
    c.num_attention_heads = wide ? 128 : 16;
    c.kv_lora_rank = 512;
    c.qk_nope_head_dim = 128;
    c.qk_rope_head_dim = 64;
    c.v_head_dim = 128;
    c.n_routed_experts = 8;
    c.num_experts_per_tok = 8;
    c.topk_group = c.n_group;
  }
  // V3.2: one layer, so both GPU models select from identical index keys and
  // queries (a second layer's would carry the kernels' rounding into its
  // indexer, whose near-ties at top-64 of 130 rows then pick differently).
  if (c.has_indexer()) c.num_hidden_layers = 1, c.first_k_dense_replace = 0;
  ASSERT_TRUE(c.Validate("real widths").ok());
  const std::string dir = JoinPath(::testing::TempDir(), "cuda_real_widths_" + GetParam());
  RandomCheckpointOptions ro;
  ro.seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "checkpoint seed " << ro.seed);
  ASSERT_TRUE(WriteRandomCheckpoint(c, dir, ro).ok());
  absl::StatusOr<CpuEngine> cpu = LoadCpu(dir);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  CudaModelOptions options = testing::SmallModelOptions();
  absl::StatusOr<std::unique_ptr<CudaModel>> fast = CudaModel::Load(dir, options);
  ASSERT_TRUE(fast.ok()) << fast.status();
  // V3.2: `fast` reads each selection straight from the pool (the default);
  // also the tuned kernel over the gathered copy, held to the plain kernel's
  // logits (the `direct` model below).
  std::unique_ptr<CudaModel> direct;
  if (c.has_indexer()) {
    CudaModelOptions o = options;
    o.sparse_mla_gather = !options.sparse_mla_gather;
    absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Load(dir, o);
    ASSERT_TRUE(m.ok()) << m.status();
    direct = std::move(*m);
  }
  options.mla_kernel = MlaKernel::kGeneric;
  absl::StatusOr<std::unique_ptr<CudaModel>> plain = CudaModel::Load(dir, options);
  ASSERT_TRUE(plain.ok()) << plain.status();

  std::mt19937 rng(ro.seed);
  std::uniform_int_distribution<int32_t> tok(2, c.vocab_size - 1);
  const std::vector<int> lens = {70, 130, 1};
  std::vector<std::vector<int32_t>> inputs(lens.size());
  std::vector<int> seq_fast, seq_plain, seq_direct;
  std::vector<SequenceKvCache> caches;
  for (size_t i = 0; i < lens.size(); ++i) {
    for (int t = 0; t < lens[i]; ++t) inputs[i].push_back(tok(rng));
    absl::StatusOr<int> a = (*fast)->AddSequence(), b = (*plain)->AddSequence();
    ASSERT_TRUE(a.ok() && b.ok());
    seq_fast.push_back(*a);
    seq_plain.push_back(*b);
    if (direct) {
      absl::StatusOr<int> d = direct->AddSequence();
      ASSERT_TRUE(d.ok());
      seq_direct.push_back(*d);
    }
    caches.push_back(cpu->model->NewCache());
  }
  // V3.2: the tuned kernel reads a dense copy of each token's selection, the
  // plain one the pool through the selection (index_topk 64 < 70, 130); V4:
  // the tuned kernel over the gathered window + entries, the plain one
  // RunV4Attention. Their CPU comparisons are printed, not held to a bound:
  // an indexer near-tie (bf16 against fp32) picks another key there.
  const bool sparse = c.has_indexer() || c.layers() == LayerArch::kV4;
  double worst_fast = 0.0, worst_plain = 0.0, worst_pair = 0.0, worst_lp = 0.0, worst_direct = 0.0;
  for (int s = 0; s < 5; ++s) {  // a prefill, then decode steps
    std::vector<SequenceTokens> bf, bp;
    for (size_t i = 0; i < lens.size(); ++i) {
      bf.push_back({seq_fast[i], inputs[i]});
      bp.push_back({seq_plain[i], inputs[i]});
    }
    absl::StatusOr<std::vector<float>> lf = (*fast)->ForwardLogits(bf);
    ASSERT_TRUE(lf.ok()) << lf.status();
    absl::StatusOr<std::vector<float>> lq = (*plain)->ForwardLogits(bp);
    ASSERT_TRUE(lq.ok()) << lq.status();
    absl::StatusOr<std::vector<float>> ld;
    if (direct) {
      std::vector<SequenceTokens> bd;
      for (size_t i = 0; i < lens.size(); ++i) bd.push_back({seq_direct[i], inputs[i]});
      ld = direct->ForwardLogits(bd);
      ASSERT_TRUE(ld.ok()) << ld.status();
    }
    for (size_t i = 0; i < lens.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "sequence " << i << " step " << s);
      if (direct) {
        const double e_direct =
            RelLogitErr(ld->data() + i * c.vocab_size, lq->data() + i * c.vocab_size, c.vocab_size);
        EXPECT_LE(e_direct, kKernelPairTolerance) << "selection read from the pool vs plain";
        worst_direct = std::max(worst_direct, e_direct);
      }
      const std::vector<float> ref = CpuStep(*cpu, &caches[i], inputs[i]);
      const float* f = lf->data() + i * c.vocab_size;
      const float* q = lq->data() + i * c.vocab_size;
      const double e_fast = RelLogitErr(f, ref.data(), c.vocab_size);
      const double e_plain = RelLogitErr(q, ref.data(), c.vocab_size);
      const double e_pair = RelLogitErr(f, q, c.vocab_size);
      if (!sparse) {  // (V3.2: an indexer near-tie may pick another row than the CPU's; both GPU
                      // paths share it)
        EXPECT_LE(e_fast, kRealWidthsTolerance) << "tuned MLA kernel vs CPU";
        EXPECT_LE(e_plain, kRealWidthsTolerance) << "plain MLA kernel vs CPU";
      }
      EXPECT_LE(e_pair, kKernelPairTolerance) << "tuned vs plain MLA kernel";
      worst_fast = std::max(worst_fast, e_fast);
      worst_plain = std::max(worst_plain, e_plain);
      worst_pair = std::max(worst_pair, e_pair);
      worst_lp = std::max(
          worst_lp, MaxDiff(LogSoftmax(f, c.vocab_size), LogSoftmax(ref.data(), c.vocab_size)));
      inputs[i] = {Argmax(ref.data(), c.vocab_size)};
    }
  }
  // Greedy steps through graphs (16-row expert tiles at batch 4 → 32 rows);
  // V3.2 against the plain kernel's model (the same selection), not the CPU.
  for (int s = 0; s < 3; ++s) {
    std::vector<SequenceTokens> batch, bp;
    for (size_t i = 0; i < lens.size(); ++i) {
      batch.push_back({seq_fast[i], inputs[i]});
      bp.push_back({seq_plain[i], inputs[i]});
    }
    absl::StatusOr<StepOutput> out = (*fast)->Step(batch);
    ASSERT_TRUE(out.ok()) << out.status();
    absl::StatusOr<std::vector<float>> lq = (*plain)->ForwardLogits(bp);
    ASSERT_TRUE(lq.ok()) << lq.status();
    if (direct) {  // through its decode graphs, the same tokens: the plain kernel's choice
      std::vector<SequenceTokens> bd;
      for (size_t i = 0; i < lens.size(); ++i) bd.push_back({seq_direct[i], inputs[i]});
      absl::StatusOr<StepOutput> od = direct->Step(bd);
      ASSERT_TRUE(od.ok()) << od.status();
      for (size_t i = 0; i < lens.size(); ++i) {
        const std::vector<double> lp = LogSoftmax(lq->data() + i * c.vocab_size, c.vocab_size);
        EXPECT_LE(std::fabs(lp[od->next_ids[i]] - od->next_logprobs[i]), 0.1)
            << "direct read, sequence " << i << " graph step " << s;
        EXPECT_GE(lp[od->next_ids[i]], *std::max_element(lp.begin(), lp.end()) - 0.1)
            << "direct read: greedy far from the plain kernel's best";
      }
    }
    for (size_t i = 0; i < lens.size(); ++i) {
      const std::vector<float> cpu_ref = CpuStep(*cpu, &caches[i], inputs[i]);
      const std::vector<float> ref = sparse
                                         ? std::vector<float>(lq->begin() + i * c.vocab_size,
                                                              lq->begin() + (i + 1) * c.vocab_size)
                                         : cpu_ref;
      const std::vector<double> lp = LogSoftmax(ref.data(), c.vocab_size);
      const int best = Argmax(ref.data(), c.vocab_size);
      EXPECT_LE(std::fabs(lp[out->next_ids[i]] - out->next_logprobs[i]), 0.1)
          << "sequence " << i << " step " << s;
      EXPECT_GE(lp[out->next_ids[i]], lp[best] - 0.1) << "greedy far from the CPU engine's best";
      inputs[i] = {out->next_ids[i]};
    }
  }
  std::printf(
      "real widths %s: logits error relative to their spread, vs the CPU engine: tuned MLA %.2e, "
      "plain "
      "MLA %.2e; tuned vs plain %.2e; max |logprob diff| %.2e\n",
      GetParam().c_str(), worst_fast, worst_plain, worst_pair, worst_lp);
  if (direct) {
    std::printf("  v3.2, the selection read from the pool vs the plain kernel: %.2e\n",
                worst_direct);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaRealWidthsTest,
                         ::testing::Values("v2-lite", "v3", "v3-wide", "v3.2", "v4"));

TEST(CudaModelTest, RejectsBadSteps) {
  MOESH_REQUIRE_GPU();
  absl::StatusOr<ModelConfig> c = PresetConfig("v2-lite", "tiny");
  ASSERT_TRUE(c.ok());
  CudaModelOptions options;
  options.max_num_seqs = 2;
  options.max_kv_blocks = 8;
  options.max_model_len = 256;
  absl::StatusOr<std::unique_ptr<CudaModel>> gpu = CudaModel::Dummy(*c, 7, options);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  absl::StatusOr<int> a = (*gpu)->AddSequence();
  ASSERT_TRUE(a.ok());
  const std::vector<int32_t> bad = {c->vocab_size};
  EXPECT_EQ((*gpu)->Step({{*a, bad}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*gpu)->Step({{*a + 5, {}}}).status().code(), absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> one = {3};
  EXPECT_EQ((*gpu)->Step({{*a, one}, {*a, one}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<StepOutput> ok = (*gpu)->Step({{*a, one}});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(std::isfinite(ok->next_logprobs[0]));
  EXPECT_TRUE((*gpu)->ReleaseSequence(*a).ok());
  EXPECT_FALSE((*gpu)->ReleaseSequence(*a).ok());
}

}  // namespace
}  // namespace moesh::cuda
