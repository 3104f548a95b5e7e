// The CPU AttentionBackend against the model it wraps: the same logits,
// ForwardSample = the Sampler's choice and log-probabilities, the KV
// pool's limits and accounting, and refusals for misuse. (The CUDA backend's
// test is tests/integration/cuda_backends_test.cc.)
#include "common/engine/attention_backend.h"

#include <algorithm>
#include <cmath>

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

// log_softmax(logits)[id] in double, computed here apart from the engine's.
double RawLogprob(const std::vector<float>& logits, size_t row, int vocab, int32_t id) {
  const float* x = logits.data() + row * vocab;
  const double mx = *std::max_element(x, x + vocab);
  double sum = 0.0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  return x[id] - mx - std::log(sum);
}

// The sampled token's own log-probability is of the raw logits (before the
// penalty and temperature that shaped the draw), and a prompt's
// log-probabilities are the model's own at each position of the prompt fed
// token by token (teacher forcing).
TEST_F(CpuAttentionBackendTest, SampledAndPromptLogprobsAreTheRawLogSoftmax) {
  const int vocab = model_->config().vocab_size;
  std::unique_ptr<AttentionBackend> b = NewCpuAttentionBackend(&model_->attention(), 16, 4);
  EXPECT_TRUE(b->has_all_position_logits());
  const std::vector<int32_t> prompt = testing_util::RandomTokens(6, vocab, 11);
  SamplingParams sp;
  sp.temperature = 1.7f, sp.repetition_penalty = 1.5f, sp.seed = 3, sp.logprobs = true;
  SamplingParams plain;  // asks for nothing
  Sampler sampler(sp);
  std::unique_ptr<KvSequence> s1 = *b->NewSequence(8), s2 = *b->NewSequence(8);
  const SequenceInput in[2] = {{prompt, s1.get()}, {prompt, s2.get()}};
  const SampleRequest req[2] = {{&sp, sampler.Draw(0), prompt, {}, /*prompt_logprobs=*/2},
                                {&plain, 0.0, prompt, {}}};
  absl::StatusOr<SampledTokens> g = b->ForwardSample(in, model_->experts(), req, 0);
  ASSERT_TRUE(g.ok()) << g.status();
  // Teacher forcing: the model's logits after each prompt prefix.
  SequenceKvCache ref = model_->NewCache();
  std::vector<std::vector<float>> rows;
  for (int32_t t : prompt) {
    SequenceInput ir{absl::MakeConstSpan(&t, 1), &ref};
    absl::StatusOr<std::vector<float>> l = model_->Forward({&ir, 1});
    ASSERT_TRUE(l.ok());
    rows.push_back(*l);
  }
  const int32_t token = g->ids[0];
  EXPECT_EQ(token, sampler.Sample(rows.back().data(), vocab, 0, prompt, {}));
  EXPECT_NEAR(g->logprobs[0], RawLogprob(rows.back(), 0, vocab, token), 1e-4);
  // Not the tempered distribution's (which the draw used).
  std::vector<float> tempered = rows.back();
  for (float& x : tempered) x /= sp.temperature;
  EXPECT_GT(std::abs(g->logprobs[0] - RawLogprob(tempered, 0, vocab, token)), 1e-3);
  EXPECT_EQ(g->logprobs[1], 0.0f);  // not asked
  EXPECT_TRUE(g->prompt_logprobs[1].logprobs.empty());
  const PromptLogprobs& p = g->prompt_logprobs[0];
  ASSERT_EQ(p.logprobs.size(), prompt.size() - 1);
  ASSERT_EQ(p.top.size(), prompt.size() - 1);
  for (size_t t = 0; t + 1 < prompt.size(); ++t) {
    EXPECT_NEAR(p.logprobs[t], RawLogprob(rows[t], 0, vocab, prompt[t + 1]), 1e-4) << t;
    ASSERT_EQ(p.top[t].size(), 2u);
    EXPECT_NEAR(p.top[t][0].logprob, RawLogprob(rows[t], 0, vocab, p.top[t][0].id), 1e-4);
    EXPECT_GE(p.top[t][0].logprob, p.logprobs[t] - 1e-6);  // the best is at least the prompt's
  }
  // The batch's other sequence sampled as if alone (the last position's row).
  EXPECT_EQ(g->ids[1], Sampler::SampleWithDraw(rows.back().data(), vocab, plain, 0.0, prompt, {}));
}

// A prompt in chunks, each naming the next chunk's first token: the chunks'
// prompt log-probabilities joined are the whole prompt's.
TEST_F(CpuAttentionBackendTest, PromptLogprobsInChunksJoinToTheWholePrompts) {
  const int vocab = model_->config().vocab_size;
  std::unique_ptr<AttentionBackend> b = NewCpuAttentionBackend(&model_->attention(), 16, 4);
  const std::vector<int32_t> prompt = testing_util::RandomTokens(11, vocab, 12);
  SamplingParams sp;
  std::unique_ptr<KvSequence> whole_seq = *b->NewSequence(12);
  const SequenceInput whole_in{prompt, whole_seq.get()};
  const SampleRequest whole_req{&sp, 0.0, prompt, {}, /*prompt_logprobs=*/3};
  absl::StatusOr<SampledTokens> whole =
      b->ForwardSample({&whole_in, 1}, model_->experts(), {&whole_req, 1}, 0);
  ASSERT_TRUE(whole.ok()) << whole.status();
  std::unique_ptr<KvSequence> seq = *b->NewSequence(12);
  PromptLogprobs joined;
  for (const auto& [from, to] : std::vector<std::pair<int, int>>{{0, 4}, {4, 5}, {5, 11}}) {
    const SequenceInput in{absl::MakeConstSpan(prompt).subspan(from, to - from), seq.get()};
    SampleRequest req{&sp, 0.0, prompt, {}, 3};
    if (to < 11) req.prompt_next = prompt[to];
    absl::StatusOr<SampledTokens> g = b->ForwardSample({&in, 1}, model_->experts(), {&req, 1}, 0);
    ASSERT_TRUE(g.ok()) << g.status();
    const PromptLogprobs& p = g->prompt_logprobs[0];
    EXPECT_EQ(p.logprobs.size(), static_cast<size_t>(to < 11 ? to - from : to - from - 1));
    joined.logprobs.insert(joined.logprobs.end(), p.logprobs.begin(), p.logprobs.end());
    joined.top.insert(joined.top.end(), p.top.begin(), p.top.end());
    if (to == 11) EXPECT_EQ(g->ids[0], whole->ids[0]);  // the last chunk samples the token
  }
  const PromptLogprobs& w = whole->prompt_logprobs[0];
  ASSERT_EQ(joined.logprobs.size(), w.logprobs.size());
  ASSERT_EQ(joined.top.size(), w.top.size());
  for (size_t t = 0; t < w.logprobs.size(); ++t) {
    EXPECT_NEAR(joined.logprobs[t], w.logprobs[t], 1e-5) << t;
    ASSERT_EQ(joined.top[t].size(), 3u);
    EXPECT_EQ(joined.top[t][0].id, w.top[t][0].id) << t;
  }
  // A next token without prompt log-probabilities, or outside the vocabulary.
  std::unique_ptr<KvSequence> bad_seq = *b->NewSequence(12);
  const SequenceInput bad_in{prompt, bad_seq.get()};
  for (const auto& [k, next] : std::vector<std::pair<int, int32_t>>{{-1, 5}, {0, vocab}}) {
    SampleRequest req{&sp, 0.0, prompt, {}, k};
    req.prompt_next = next;
    EXPECT_EQ(b->ForwardSample({&bad_in, 1}, model_->experts(), {&req, 1}, 0).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
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
