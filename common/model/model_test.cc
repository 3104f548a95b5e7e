// Properties of the forward pass that must hold for any checkpoint: decoding
// with the latent cache equals recomputing the prefix, batching sequences
// equals running them alone, and experts split across shards equal all
// experts in one place.
#include "common/model/model.h"

#include <algorithm>
#include <filesystem>
#include <random>

#include "base/file_util.h"
#include "common/model/model_test_util.h"
#include "common/model/random_checkpoint.h"
#include "common/model/safetensors.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

using testing_util::MaxAbsDiff;
using testing_util::RandomTokens;

std::string Checkpoint(const std::string& family) {
  const std::string dir = JoinPath(::testing::TempDir(), "model_test_" + family);
  if (!FileExists(JoinPath(dir, "config.json"))) {
    absl::StatusOr<ModelConfig> c = PresetConfig(family, "tiny");
    EXPECT_TRUE(c.ok());
    RandomCheckpointOptions opt;
    opt.seed = 11;
    EXPECT_TRUE(WriteRandomCheckpoint(*c, dir, opt).ok());
  }
  return dir;
}

class ModelTest : public testing_util::ModelFixture {
 protected:
  void SetUp() override { LoadModel(Checkpoint(GetParam())); }
};

TEST_P(ModelTest, CachedDecodingEqualsRecomputation) {
  const std::vector<int32_t> tokens = RandomTokens(40, vocab_, 5);
  // Reference: one forward over everything, logits at every position.
  SequenceKvCache full_cache = model_->NewCache();
  const std::vector<float> full = Run(tokens, &full_cache, LogitsFor::kAllTokens);
  // Incremental: a 13-token prefill, a 5-token chunk, then one token at a time.
  SequenceKvCache cache = model_->NewCache();
  size_t pos = 0;
  std::vector<size_t> chunks = {13, 5};
  while (pos < tokens.size()) {
    const size_t n = chunks.empty() ? 1 : chunks.front();
    if (!chunks.empty()) chunks.erase(chunks.begin());
    std::vector<int32_t> chunk(tokens.begin() + pos, tokens.begin() + pos + n);
    const std::vector<float> last = Run(chunk, &cache);
    pos += n;
    ASSERT_EQ(cache.length(), static_cast<int>(pos));
    EXPECT_LE(MaxAbsDiff(last.data(), &full[(pos - 1) * vocab_], vocab_), 1e-4f)
        << "position " << pos - 1;
  }
  // The cached rows are identical however they were produced.
  for (int l = 0; l < model_->config().num_hidden_layers; ++l) {
    EXPECT_LE(MaxAbsDiff(cache.rows(l), full_cache.rows(l), tokens.size() * cache.row_width()),
              1e-5f);
  }
}

TEST_P(ModelTest, BatchEqualsSequencesAlone) {
  std::vector<std::vector<int32_t>> prompts = {
      RandomTokens(7, vocab_, 1), RandomTokens(1, vocab_, 2), RandomTokens(19, vocab_, 3)};
  std::vector<SequenceKvCache> caches(prompts.size(), model_->NewCache());
  std::vector<SequenceInput> inputs;
  for (size_t i = 0; i < prompts.size(); ++i) inputs.push_back({prompts[i], &caches[i]});
  absl::StatusOr<std::vector<float>> batched = model_->Forward(inputs);
  ASSERT_TRUE(batched.ok()) << batched.status();
  ASSERT_EQ(batched->size(), prompts.size() * vocab_);
  for (size_t i = 0; i < prompts.size(); ++i) {
    SequenceKvCache alone_cache = model_->NewCache();
    const std::vector<float> alone = Run(prompts[i], &alone_cache);
    EXPECT_LE(MaxAbsDiff(alone.data(), &(*batched)[i * vocab_], vocab_), 1e-4f) << "sequence " << i;
  }
  // Ping-pong micro-batches give exactly the same logits.
  for (int mb : {2, 3}) {
    std::vector<SequenceKvCache> mb_caches(prompts.size(), model_->NewCache());
    std::vector<SequenceInput> mb_inputs;
    for (size_t i = 0; i < prompts.size(); ++i) mb_inputs.push_back({prompts[i], &mb_caches[i]});
    absl::StatusOr<std::vector<float>> split =
        model_->attention().Forward(mb_inputs, model_->experts(), LogitsFor::kLastToken, mb);
    ASSERT_TRUE(split.ok()) << split.status();
    EXPECT_EQ(*split, *batched) << mb << " micro-batches";
  }
  // A decode step for the batch: each sequence continues from its own cache.
  std::vector<std::vector<int32_t>> next = {{4}, {9}, {16}};
  for (size_t i = 0; i < prompts.size(); ++i) inputs[i] = {next[i], &caches[i]};
  absl::StatusOr<std::vector<float>> step = model_->Forward(inputs);
  ASSERT_TRUE(step.ok());
  for (size_t i = 0; i < prompts.size(); ++i) {
    std::vector<int32_t> all = prompts[i];
    all.push_back(next[i][0]);
    SequenceKvCache c = model_->NewCache();
    const std::vector<float> ref = Run(all, &c);
    EXPECT_LE(MaxAbsDiff(ref.data(), &(*step)[i * vocab_], vocab_), 1e-4f) << "sequence " << i;
  }
}

TEST_P(ModelTest, ShardedExpertsEqualLocal) {
  ExpectShardedExpertsEqualLocal(Checkpoint(GetParam()), 12);
}

TEST_P(ModelTest, RejectsBadInputs) {
  SequenceKvCache cache = model_->NewCache();
  std::vector<int32_t> bad = {1, vocab_};
  SequenceInput in{bad, &cache};
  absl::StatusOr<std::vector<float>> r = model_->Forward(absl::MakeConstSpan(&in, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> negative = {-1};
  in = {negative, &cache};
  EXPECT_EQ(model_->Forward(absl::MakeConstSpan(&in, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> empty;
  in = {empty, &cache};
  EXPECT_EQ(model_->Forward(absl::MakeConstSpan(&in, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> too_long =
      RandomTokens(model_->config().max_position_embeddings + 1, vocab_, 1);
  in = {too_long, &cache};
  EXPECT_EQ(model_->Forward(absl::MakeConstSpan(&in, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Families, ModelTest,
                         ::testing::Values("v2-lite", "v2", "v3", "v3.2", "v4"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           std::replace(n.begin(), n.end(), '.', '_');
                           return n;
                         });

}  // namespace
}  // namespace moesh
