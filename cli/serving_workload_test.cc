#include "cli/serving_workload.h"

#include <fstream>
#include <map>

#include "base/file_util.h"
#include "gtest/gtest.h"

namespace moesh::cli {
namespace {

TEST(ServingWorkloadTest, LognormalLengthsHaveTheAskedMean) {
  std::mt19937_64 rng(3);
  double sum = 0;
  int below = 0, above = 0;
  constexpr int kN = 20000;
  for (int i = 0; i < kN; ++i) {
    const int n = LognormalLength(200, 0.5, &rng);
    ASSERT_GE(n, 1);
    sum += n;
    below += n < 100;
    above += n > 400;
  }
  EXPECT_NEAR(sum / kN, 200, 5);
  EXPECT_GT(below, 0);  // spread, not a constant
  EXPECT_GT(above, 0);
  EXPECT_EQ(LognormalLength(37, 0, &rng), 37);
}

TEST(ServingWorkloadTest, RandomDatasetIsSeededAndInTheVocabulary) {
  const std::vector<Conversation> a = RandomDataset(50, 30, 10, 0.5, 100, 9);
  const std::vector<Conversation> b = RandomDataset(50, 30, 10, 0.5, 100, 9);
  ASSERT_EQ(a.size(), 50u);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].user.size(), 1u);
    EXPECT_TRUE(a[i].prefix.empty());
    EXPECT_EQ(a[i].user[0], b[i].user[0]);
    EXPECT_EQ(a[i].max_new_tokens, b[i].max_new_tokens);
    for (int32_t t : a[i].user[0]) {
      EXPECT_GE(t, 2);
      EXPECT_LT(t, 100);
    }
  }
}

TEST(ServingWorkloadTest, MultiTurnConversationsShareSystemPrompts) {
  const std::vector<Conversation> c = MultiTurnDataset(6, 3, 2, 16, 8, 4, 0.3, 500, 1);
  ASSERT_EQ(c.size(), 6u);
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(c[i].prefix.size(), 16u);
    EXPECT_EQ(c[i].user.size(), 3u);
    EXPECT_EQ(c[i].max_new_tokens.size(), 3u);
    EXPECT_EQ(c[i].prefix, c[i % 2].prefix);  // two system prompts, shared
  }
  EXPECT_NE(c[0].prefix, c[1].prefix);
  EXPECT_NE(c[0].user[0], c[2].user[0]);  // the same prompt, different users
}

TEST(ServingWorkloadTest, ShareGptTakesTheFirstHumanTurnAndItsReplyLength) {
  const std::string path = JoinPath(::testing::TempDir(), "sharegpt.json");
  std::ofstream(path) << R"([
    {"id": "a", "conversations": [{"from": "human", "value": "hello there"},
                                  {"from": "gpt", "value": "general kenobi"}]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "no human first"},
                                  {"from": "human", "value": "x"}]},
    {"id": "c", "conversations": [{"from": "human", "value": "alone"}]},
    {"id": "d", "conversations": [{"from": "user", "value": "one two three"},
                                  {"from": "assistant", "value": "four"},
                                  {"from": "user", "value": "later turns are ignored"}]}
  ])";
  // A word a token.
  auto tokenize = [](const std::string& text) -> absl::StatusOr<std::vector<int32_t>> {
    std::vector<int32_t> ids;
    bool in_word = false;
    for (char ch : text) {
      if (ch != ' ' && !in_word) ids.push_back(static_cast<int32_t>(ids.size()) + 5);
      in_word = ch != ' ';
    }
    return ids;
  };
  absl::StatusOr<std::vector<Conversation>> c = ShareGptDataset(path, 10, tokenize);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->size(), 2u);
  EXPECT_EQ((*c)[0].user[0], (std::vector<int32_t>{5, 6}));
  EXPECT_EQ((*c)[0].max_new_tokens[0], 2);
  EXPECT_EQ((*c)[1].user[0].size(), 3u);
  EXPECT_EQ((*c)[1].max_new_tokens[0], 1);
  absl::StatusOr<std::vector<Conversation>> one = ShareGptDataset(path, 1, tokenize);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 1u);

  std::ofstream(path) << "{\"not\": \"an array\"}";
  EXPECT_EQ(ShareGptDataset(path, 10, tokenize).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShareGptDataset(path + ".missing", 10, tokenize).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ServingWorkloadTest, SummaryCountsPercentilesAndGoodput) {
  std::vector<RequestRecord> records;
  for (int i = 1; i <= 100; ++i) {
    RequestRecord r;
    r.ttft = i * 0.01;  // 10 ms .. 1 s
    r.e2e = r.ttft + 1.0;
    r.itl = {0.001 * i, 0.001 * i};  // 1 .. 100 ms
    r.prompt_tokens = 10;
    r.output_tokens = 3;
    r.cached_tokens = i % 2 == 0 ? 10 : 0;
    records.push_back(r);
  }
  RequestRecord refused;
  refused.code = grpc::StatusCode::RESOURCE_EXHAUSTED;
  refused.error = "queue full";
  RequestRecord failed;
  failed.code = grpc::StatusCode::UNAVAILABLE;
  records.push_back(refused);
  records.push_back(failed);
  const RunSummary s = RunSummary::Of(records, 10.0, /*slo_ttft_s=*/0.5, /*slo_itl_s=*/0.0205);
  EXPECT_EQ(s.sent, 102);
  EXPECT_EQ(s.completed, 100);
  EXPECT_EQ(s.refused, 1);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.first_error, "queue full");
  EXPECT_EQ(s.output_tokens, 300);
  EXPECT_EQ(s.cached_tokens, 500);
  EXPECT_NEAR(s.ttft[0], 0.51, 1e-9);
  EXPECT_NEAR(s.ttft[1], 0.90, 0.011);
  EXPECT_NEAR(s.ttft[2], 0.99, 0.011);
  EXPECT_LE(s.itl[0], s.itl[1]);
  EXPECT_LE(s.itl[1], s.itl[2]);
  EXPECT_NEAR(s.e2e[0], 1.51, 1e-9);
  EXPECT_EQ(s.good, 20);  // TTFT <= 0.5 s (50 of them), mean ITL <= 20.5 ms (20)
  EXPECT_EQ(RunSummary::Of(records, 10.0, 0, 0).good, 100);
  EXPECT_EQ(Percentile({}, 0.5), 0);
}

// A closed loop of 2 streams over 4 requests, each a token every second from
// 1 s after its send: streams fill at t = 1 (both first tokens), the last
// request is sent at t = 5; in [1, 5] the streams bring 2 tokens a second
// (9 tokens: t 1, 1, 2, 2, 3, 3, 4, 4, 5; 4 s), the ramp and the tail left out.
TEST(RunSummaryTest, SteadyRateLeavesOutTheRampAndTheTail) {
  std::vector<RequestRecord> records;
  for (double start : {0.0, 0.0, 4.0, 5.0}) {
    RequestRecord r;
    r.start = start;
    r.ttft = 1.0;
    r.itl = {1.0, 1.0, 1.0};  // tokens at start + 1, 2, 3, 4
    records.push_back(r);
  }
  // Tokens: [1 2 3 4], [1 2 3 4], [5 6 7 8], [6 7 8 9]; in [1, 5]: 4 + 4 + 1 = 9.
  EXPECT_NEAR(SteadyTokensPerSecond(records, 2), 9.0 / 4.0, 1e-9);
  EXPECT_EQ(SteadyTokensPerSecond(records, 5), 0);  // never 5 streams
  records.resize(1);
  EXPECT_EQ(SteadyTokensPerSecond(records, 1), 0);  // sent at 0, first token at 1: no window
}

}  // namespace
}  // namespace moesh::cli
