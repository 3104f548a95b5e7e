// DeepSeek-V4 in the engine, on the checkpoints transformers wrote for the
// golden tests: every layer type (sliding, CSA, HCA) decodes from its cache
// rows exactly as a recomputation does, whatever cache holds the rows
// (contiguous, paged, handed off), batched or alone, with the routed experts
// in one place or split across shards.
#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "base/file_util.h"
#include "common/engine/paged_kv_cache.h"
#include "common/model/model.h"
#include "common/model/model_test_util.h"
#include "common/model/random_checkpoint.h"
#include "common/model/safetensors.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

using testing_util::MaxAbsDiff;
constexpr auto& Tokens = testing_util::RandomTokens;

std::string GoldenDir(const std::string& name) {
  return JoinPath(JoinPath(MOESH_SOURCE_DIR, "tests/golden"), name);
}

class V4ModelTest : public testing_util::ModelFixture {
 protected:
  void SetUp() override { LoadModel(GoldenDir(GetParam())); }
};

TEST_P(V4ModelTest, ConfigCoversEveryPath) {
  const ModelConfig& c = model_->config();
  ASSERT_TRUE(c.layers() == LayerArch::kV4);
  std::set<V4AttentionType> types(c.v4.layer_types.begin(), c.v4.layer_types.end());
  EXPECT_EQ(types.size(), 3u) << "sliding, CSA and HCA layers";
  EXPECT_TRUE(std::count(c.v4.hash_layers.begin(), c.v4.hash_layers.end(), true) > 0);
  EXPECT_TRUE(std::count(c.v4.hash_layers.begin(), c.v4.hash_layers.end(), false) > 0);
}

TEST_P(V4ModelTest, CachedDecodingEqualsRecomputation) {
  // Longer than the sliding window and several compress windows (for v4_legacy
  // one 128-token HCA window).
  const ModelConfig& c = model_->config();
  const int n = std::min(c.max_position_embeddings,
                         std::max(2 * c.v4.compress_rate_hca, 3 * c.v4.sliding_window) + 7);
  const std::vector<int32_t> tokens = Tokens(n, vocab_, 5);
  SequenceKvCache full_cache = model_->NewCache();
  const std::vector<float> full = Run(tokens, &full_cache, LogitsFor::kAllTokens);
  SequenceKvCache cache = model_->NewCache();
  size_t pos = 0;
  std::vector<size_t> chunks = {13, 6,
                                3};  // prefill, chunks across window boundaries, then one by one
  while (pos < tokens.size()) {
    const size_t take = std::min(tokens.size() - pos, chunks.empty() ? size_t{1} : chunks.front());
    if (!chunks.empty()) chunks.erase(chunks.begin());
    std::vector<int32_t> chunk(tokens.begin() + pos, tokens.begin() + pos + take);
    const std::vector<float> last = Run(chunk, &cache);
    pos += take;
    ASSERT_EQ(cache.length(), static_cast<int>(pos));
    EXPECT_LE(MaxAbsDiff(last.data(), &full[(pos - 1) * vocab_], vocab_), 1e-4f)
        << "position " << pos - 1;
  }
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    EXPECT_LE(MaxAbsDiff(cache.rows(l), full_cache.rows(l), tokens.size() * cache.row_width()),
              1e-5f);
  }
}

TEST_P(V4ModelTest, PagedCacheAndHandoffEqualContiguous) {
  const ModelConfig& c = model_->config();
  const std::vector<int32_t> prompt = Tokens(2 * c.v4.sliding_window + 3, vocab_, 9);
  SequenceKvCache prefill = model_->NewCache();
  const std::vector<float> first = Run(prompt, &prefill);
  KvBlockPool pool(c.num_hidden_layers, model_->attention().kv_row_width(), /*block_size=*/4,
                   /*num_blocks=*/32);
  absl::StatusOr<std::unique_ptr<PagedKvSequence>> paged =
      pool.Allocate(static_cast<int>(prompt.size()) + 16);
  ASSERT_TRUE(paged.ok());
  for (int l = 0; l < c.num_hidden_layers; ++l)
    (*paged)->AppendRows(l, prefill.rows(l), prefill.length());
  std::vector<int32_t> all = prompt;
  int32_t next = static_cast<int32_t>(std::max_element(first.begin(), first.end()) - first.begin());
  for (int step = 0; step < 10; ++step) {
    all.push_back(next);
    const std::vector<float> on_paged = Run({next}, paged->get());
    const std::vector<float> on_flat = Run({next}, &prefill);
    EXPECT_EQ(on_paged, on_flat) << "step " << step;
    SequenceKvCache fresh = model_->NewCache();
    const std::vector<float> recomputed = Run(all, &fresh);
    EXPECT_LE(MaxAbsDiff(on_paged.data(), recomputed.data(), vocab_), 1e-4f) << "step " << step;
    next =
        static_cast<int32_t>(std::max_element(on_paged.begin(), on_paged.end()) - on_paged.begin());
  }
}

TEST_P(V4ModelTest, BatchEqualsSequencesAlone) {
  std::vector<std::vector<int32_t>> prompts = {Tokens(11, vocab_, 1), Tokens(1, vocab_, 2),
                                               Tokens(23, vocab_, 3)};
  std::vector<SequenceKvCache> caches(prompts.size(), model_->NewCache());
  std::vector<SequenceInput> inputs;
  for (size_t i = 0; i < prompts.size(); ++i) inputs.push_back({prompts[i], &caches[i]});
  absl::StatusOr<std::vector<float>> batched = model_->Forward(inputs);
  ASSERT_TRUE(batched.ok()) << batched.status();
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceKvCache alone = model_->NewCache();
    const std::vector<float> ref = Run(prompts[i], &alone);
    EXPECT_LE(MaxAbsDiff(ref.data(), &(*batched)[i * vocab_], vocab_), 1e-4f) << "sequence " << i;
  }
}

TEST_P(V4ModelTest, ShardedExpertsEqualLocal) {
  ExpectShardedExpertsEqualLocal(GoldenDir(GetParam()), 30);
}

INSTANTIATE_TEST_SUITE_P(Goldens, V4ModelTest, ::testing::Values("v4", "v4_legacy"));

// `moesh mkmodel --family v4` checkpoints load and decode like the goldens'.
TEST(V4PresetTest, RandomCheckpointRoundTrips) {
  for (const char* preset : {"tiny", "small"}) {
    SCOPED_TRACE(preset);
    absl::StatusOr<ModelConfig> c = PresetConfig("v4", preset);
    ASSERT_TRUE(c.ok()) << c.status();
    const std::string dir = JoinPath(::testing::TempDir(), std::string("v4_preset_") + preset);
    RandomCheckpointOptions opt;
    opt.seed = 4;
    ASSERT_TRUE(WriteRandomCheckpoint(*c, dir, opt).ok());
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ((*m)->config().v4.layer_types, c->v4.layer_types);
    EXPECT_EQ((*m)->config().v4.hash_layers, c->v4.hash_layers);
    EXPECT_EQ((*m)->config().qk_rope_head_dim, c->qk_rope_head_dim);
    EXPECT_EQ((*m)->config().v4.compress_rope.factor, c->v4.compress_rope.factor);
    // Decoding past a few compress windows equals recomputation.
    const int n = std::string(preset) == "tiny" ? 30 : 12;
    const std::vector<int32_t> tokens = Tokens(n, c->vocab_size, 2);
    SequenceKvCache full = (*m)->NewCache(), inc = (*m)->NewCache();
    SequenceInput all{tokens, &full};
    absl::StatusOr<std::vector<float>> ref =
        (*m)->Forward(absl::MakeConstSpan(&all, 1), LogitsFor::kAllTokens);
    ASSERT_TRUE(ref.ok()) << ref.status();
    for (int t = 0; t < n; ++t) {
      std::vector<int32_t> one = {tokens[t]};
      SequenceInput in{one, &inc};
      absl::StatusOr<std::vector<float>> step = (*m)->Forward(absl::MakeConstSpan(&in, 1));
      ASSERT_TRUE(step.ok());
      EXPECT_LE(MaxAbsDiff(step->data(), ref->data() + static_cast<size_t>(t) * c->vocab_size,
                           c->vocab_size),
                1e-4f)
          << "position " << t;
    }
  }
}

}  // namespace
}  // namespace moesh
