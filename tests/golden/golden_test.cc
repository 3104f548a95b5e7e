// The CPU engine against transformers 5.17: identical greedy tokens and
// log-probabilities within 1e-3 on checkpoints written by save_pretrained
// (tests/golden/make_hf_goldens.py made them on the GPU machine).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "common/engine/generate.h"
#include "common/model/model.h"
#include "common/model/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"
#include "nlohmann/json.hpp"

namespace moesh {
namespace {

constexpr double kLogprobTolerance = 1e-3;

std::string GoldenDir(const std::string& name) {
  return JoinPath(JoinPath(MOESH_SOURCE_DIR, "tests/golden"), name);
}

// Max |log_softmax(a) - log_softmax(b)| over one row of `vocab` logits.
double MaxLogprobDiff(const float* a, const float* b, int vocab) {
  std::vector<float> la(vocab), lb(vocab);
  cpu::LogSoftmax(a, la.data(), vocab);
  cpu::LogSoftmax(b, lb.data(), vocab);
  double worst = 0.0;
  for (int i = 0; i < vocab; ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(la[i]) - lb[i]));
  return worst;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenTest, MatchesTransformers) {
  const std::string dir = GoldenDir(GetParam());
  absl::StatusOr<std::string> text = ReadFileToString(JoinPath(dir, "golden.json"));
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json golden = nlohmann::json::parse(*text);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> logits_file =
      SafetensorsFile::Open(JoinPath(dir, "golden_logits.safetensors"));
  ASSERT_TRUE(logits_file.ok()) << logits_file.status();
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  const int vocab = (*model)->config().vocab_size;

  double worst_decode = 0.0, worst_prefill = 0.0;
  const auto& prompts = golden["prompts"];
  ASSERT_GE(prompts.size(), 3u);
  for (size_t p = 0; p < prompts.size(); ++p) {
    SCOPED_TRACE("prompt " + std::to_string(p));
    const std::vector<int32_t> prompt = prompts[p].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = golden["output_ids"][p].get<std::vector<int32_t>>();
    const TensorView& hf_logits = (*logits_file)->tensors().at("logits_" + std::to_string(p));
    ASSERT_EQ(hf_logits.dtype, DType::kF32);
    ASSERT_EQ(hf_logits.shape, (std::vector<int64_t>{static_cast<int64_t>(want.size()), vocab}));
    const float* hf = reinterpret_cast<const float*>(hf_logits.data);

    // Greedy decoding with the cache: same tokens, same per-step distribution.
    SamplingParams sp;  // greedy
    sp.top_logprobs = vocab;
    StopParams stop;
    stop.max_new_tokens = static_cast<int>(want.size());
    stop.ignore_eos = true;
    absl::StatusOr<GenerationResult> got = Generate(**model, prompt, sp, stop);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->output_ids, want);
    ASSERT_EQ(got->top_logprobs.size(), want.size());
    for (size_t s = 0; s < want.size(); ++s) {
      std::vector<float> hf_lp(vocab);
      cpu::LogSoftmax(hf + s * vocab, hf_lp.data(), vocab);
      double worst = 0.0;
      for (const TokenLogprob& t : got->top_logprobs[s]) {
        worst = std::max(worst, std::fabs(static_cast<double>(t.logprob) - hf_lp[t.id]));
      }
      EXPECT_LE(worst, kLogprobTolerance) << "step " << s;
      worst_decode = std::max(worst_decode, worst);
    }

    // Prefill: logits at every prompt position from one batched forward.
    const TensorView& hf_prefill =
        (*logits_file)->tensors().at("prefill_logits_" + std::to_string(p));
    SequenceKvCache cache = (*model)->NewCache();
    SequenceInput in{prompt, &cache};
    absl::StatusOr<std::vector<float>> all =
        (*model)->Forward(absl::MakeConstSpan(&in, 1), LogitsFor::kAllTokens);
    ASSERT_TRUE(all.ok()) << all.status();
    ASSERT_EQ(all->size(), prompt.size() * vocab);
    for (size_t t = 0; t < prompt.size(); ++t) {
      const double d =
          MaxLogprobDiff(all->data() + t * vocab,
                         reinterpret_cast<const float*>(hf_prefill.data) + t * vocab, vocab);
      EXPECT_LE(d, kLogprobTolerance) << "prompt position " << t;
      worst_prefill = std::max(worst_prefill, d);
    }
  }
  std::printf("%s: max |logprob - transformers| decode %.2e, prefill %.2e (tolerance %.0e)\n",
              GetParam().c_str(), worst_decode, worst_prefill, kLogprobTolerance);
}

INSTANTIATE_TEST_SUITE_P(Transformers, GoldenTest,
                         ::testing::Values("v2_lite", "v2", "v3", "v3_neox", "v32",
                                           "v32_dense_rope", "v4", "v4_legacy"));

}  // namespace
}  // namespace moesh
