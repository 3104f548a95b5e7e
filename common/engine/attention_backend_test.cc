// The CPU AttentionBackend against the model it wraps: the same logits,
// ForwardSample = the Sampler's choice and log-probabilities, the KV
// pool's limits and accounting, and refusals for misuse. (The CUDA backend's
// test is tests/integration/cuda_backends_test.cc.)
#include "common/engine/attention_backend.h"

#include <algorithm>

#include "base/file_util.h"
#include "common/engine/sampler.h"
#include "common/model/model.h"
#include "common/model/model_test_util.h"
#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

class CpuAttentionBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = JoinPath(::testing::TempDir(), "attention_backend_model");
    absl::StatusOr<ModelConfig> c = PresetConfig("v3", "tiny");
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(WriteRandomCheckpoint(*c, dir, {}).ok());
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
  }
  std::unique_ptr<Model> model_;
};

TEST_F(CpuAttentionBackendTest, ForwardIsTheModelsAndSampleIsTheSamplers) {
  const int vocab = model_->config().vocab_size;
  std::unique_ptr<AttentionBackend> a =
      NewCpuAttentionBackend(&model_->attention(), /*num_kv_blocks=*/16, 4);
  std::unique_ptr<AttentionBackend> b = NewCpuAttentionBackend(&model_->attention(), 0, 4);
  EXPECT_EQ(a->device(), "cpu");
  EXPECT_FALSE(a->has_experts());
  const std::vector<int32_t> prompt = testing_util::RandomTokens(7, vocab, 3);
  std::unique_ptr<KvSequence> sa = *a->NewSequence(12);
  std::unique_ptr<KvSequence> sb = *b->NewSequence(12);
  SequenceKvCache ref = model_->NewCache();
  std::vector<int32_t> next = prompt;
  SamplingParams sampled;  // alternating with greedy
  sampled.temperature = 0.8f, sampled.top_p = 0.9f, sampled.repetition_penalty = 1.2f,
  sampled.seed = 7;
  sampled.top_logprobs = 3;
  SamplingParams greedy;
  greedy.top_logprobs = 3;
  std::vector<int32_t> output;
  for (int step = 0; step < 4; ++step) {
    const SamplingParams& params = step % 2 ? greedy : sampled;
    Sampler sampler(params);
    SequenceInput ia{next, sa.get()}, ib{next, sb.get()}, ir{next, &ref};
    const SampleRequest req{&params, sampler.Draw(step), prompt, output};
    absl::StatusOr<std::vector<float>> want = model_->Forward({&ir, 1});
    absl::StatusOr<std::vector<float>> got = a->Forward({&ia, 1}, model_->experts());
    absl::StatusOr<SampledTokens> g = b->ForwardSample({&ib, 1}, model_->experts(), {&req, 1}, 3);
    ASSERT_TRUE(want.ok() && got.ok() && g.ok());
    EXPECT_EQ(*got, *want) << "step " << step;  // paged rows, the same numbers
    const int32_t token = sampler.Sample(want->data(), vocab, step, prompt, output);
    EXPECT_EQ(g->ids[0], token);
    const std::vector<TokenLogprob> top = Sampler::TopLogprobs(want->data(), vocab, 3);
    ASSERT_EQ(g->top_logprobs[0].size(), 3u);
    for (int j = 0; j < 3; ++j) {
      EXPECT_EQ(g->top_logprobs[0][j].id, top[j].id);
      EXPECT_EQ(g->top_logprobs[0][j].logprob, top[j].logprob);
    }
    output.push_back(token);
    next = {token};
  }
  EXPECT_EQ(sa->length(), 7 + 3);
  SequenceInput ib{next, sb.get()};
  const SampleRequest req{&greedy, 0.5, prompt, output};
  EXPECT_EQ(b->ForwardSample({&ib, 1}, model_->experts(), {&req, 1}, vocab + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->ForwardSample({&ib, 1}, model_->experts(), {}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  const SampleRequest bad_draw{&greedy, 1.0, prompt, output};
  EXPECT_EQ(b->ForwardSample({&ib, 1}, model_->experts(), {&bad_draw, 1}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuAttentionBackendTest, PoolLimitsAccountingAndMisuse) {
  std::unique_ptr<AttentionBackend> a =
      NewCpuAttentionBackend(&model_->attention(), /*num_kv_blocks=*/4, 8);
  KvUsage u = a->kv_usage();
  EXPECT_EQ(u.total_blocks, 4);
  EXPECT_EQ(u.free_blocks, 4);
  EXPECT_EQ(u.block_size, 8);
  EXPECT_EQ(u.used_fraction(), 0.0);
  absl::StatusOr<std::unique_ptr<KvSequence>> s1 = a->NewSequence(20);  // 3 blocks
  ASSERT_TRUE(s1.ok());
  EXPECT_EQ(a->kv_usage().free_blocks, 1);
  EXPECT_DOUBLE_EQ(a->kv_usage().used_fraction(), 0.75);
  EXPECT_EQ(a->NewSequence(9).status().code(), absl::StatusCode::kResourceExhausted);
  s1->reset();
  EXPECT_EQ(a->kv_usage().free_blocks, 4);
  const int limit = model_->config().max_position_embeddings;
  EXPECT_EQ(a->NewSequence(limit + 1).status().code(), absl::StatusCode::kInvalidArgument);
  // The routed experts come as an ExpertClient on the CPU.
  std::unique_ptr<KvSequence> s = *a->NewSequence(4);
  const std::vector<int32_t> t = {1};
  SequenceInput in{t, s.get()};
  EXPECT_EQ(a->Forward({&in, 1}, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  // An unbounded backend reports no pool.
  EXPECT_EQ(NewCpuAttentionBackend(&model_->attention(), 0, 8)->kv_usage().total_blocks, 0);
}

}  // namespace
}  // namespace moesh
