// The prefix cache on the CPU backend is exact up to float32 rounding: a
// prompt whose prefix comes from the cache gives the logits of the prompt
// computed whole, the same greedy token each step, for V3 (MLA latent rows),
// V3.2 (the indexer's keys in the same rows) and V4 (the compressors' inputs
// in the same rows). Not bit for bit: OpenBLAS rounds a row of a product
// differently with the number of rows (its AVX-512 kernels do, measured
// 2e-7 on logits of ~0.5), and the cached prompt's products have fewer rows;
// a wrong row, position or block moves the logits by their whole spread.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "common/engine/attention_backend.h"
#include "common/model/model.h"
#include "common/model/model_test_util.h"
#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

class PrefixCacheExactTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PrefixCacheExactTest, CachedPrefixGivesTheSameLogitsAsComputingIt) {
  std::string name = GetParam();
  for (char& ch : name) ch = ch == '.' ? '_' : ch;
  const std::string dir = JoinPath(::testing::TempDir(), "prefix_cache_" + name);
  absl::StatusOr<ModelConfig> c = PresetConfig(GetParam(), "tiny");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(WriteRandomCheckpoint(*c, dir, {}).ok());
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  const int vocab = (*m)->config().vocab_size;
  std::unique_ptr<AttentionBackend> cached =
      NewCpuAttentionBackend(&(*m)->attention(), /*num_kv_blocks=*/32, /*block_size=*/4,
                             /*prefix_cache=*/true);
  std::unique_ptr<AttentionBackend> plain =
      NewCpuAttentionBackend(&(*m)->attention(), 32, 4, /*prefix_cache=*/false);
  const int all_free = cached->kv_usage().free_blocks;

  // Turn 1 publishes its history's full blocks.
  const std::vector<int32_t> history = testing_util::RandomTokens(18, vocab, 5);
  {
    std::unique_ptr<KvSequence> s = *cached->NewCachedSequence(18, history);
    EXPECT_EQ(s->cached_tokens(), 0);
    SequenceInput in{history, s.get()};
    ASSERT_TRUE(cached->Forward({&in, 1}, (*m)->experts()).ok());
    s->PublishPrefix(history);
  }
  // Turn 2: the history and more; then teacher-forced tokens one at a time.
  std::vector<int32_t> prompt = history;
  for (int32_t t : testing_util::RandomTokens(6, vocab, 9)) prompt.push_back(t);
  const std::vector<int32_t> forced = testing_util::RandomTokens(5, vocab, 11);
  std::unique_ptr<KvSequence> sc = *cached->NewCachedSequence(40, prompt);
  std::unique_ptr<KvSequence> sp = *plain->NewCachedSequence(40, prompt);
  ASSERT_EQ(sc->cached_tokens(), 16);  // 4 full blocks of the 18 history tokens
  EXPECT_EQ(sc->length(), 16);
  EXPECT_EQ(sp->cached_tokens(), 0);
  EXPECT_EQ(cached->prefix_cache_stats().hit_tokens, 16);
  for (int step = 0; step <= static_cast<int>(forced.size()); ++step) {
    std::vector<int32_t> tc, tp;
    if (step == 0) {
      tc.assign(prompt.begin() + sc->length(), prompt.end());  // only the uncached suffix
      tp = prompt;
    } else {
      tc = tp = {forced[step - 1]};
    }
    SequenceInput ic{tc, sc.get()}, ip{tp, sp.get()};
    absl::StatusOr<std::vector<float>> lc = cached->Forward({&ic, 1}, (*m)->experts());
    absl::StatusOr<std::vector<float>> lp = plain->Forward({&ip, 1}, (*m)->experts());
    ASSERT_TRUE(lc.ok() && lp.ok());
    ASSERT_EQ(lc->size(), lp->size());
    EXPECT_LE(testing_util::MaxAbsDiff(lc->data(), lp->data(), lc->size()), 1e-5)
        << GetParam() << " step " << step;
    EXPECT_EQ(std::max_element(lc->begin(), lc->end()) - lc->begin(),
              std::max_element(lp->begin(), lp->end()) - lp->begin())
        << GetParam() << " step " << step;
  }
  sc.reset(), sp.reset();
  // No leaked references: every block reclaimable again.
  EXPECT_EQ(cached->kv_usage().free_blocks, all_free);
  EXPECT_GT(cached->prefix_cache_stats().cached_blocks, 0);
}

INSTANTIATE_TEST_SUITE_P(Families, PrefixCacheExactTest, ::testing::Values("v3", "v3.2", "v4"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param;
                           for (char& ch : n) ch = ch == '.' ? '_' : ch;
                           return n;
                         });

}  // namespace
}  // namespace moesh
