// Preemption by swap (DecodeEngineOptions::preemption_mode = kSwap) on the
// colocated engines: a request preempted when the pool runs dry has its KV
// rows copied to host memory and back, and its stream equals the one it
// would have had uninterrupted (ids and log-probabilities, greedy and seeded
// sampling, with and without the prefix cache); past the swap space it
// recomputes instead and says so in its metrics; cancelling swapped requests
// frees their host copies and every block.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/file_util.h"
#include "common/metrics/metrics.h"
#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"
#include "router/colocated_backend.h"
#include "router/colocated_test_util.h"

namespace moesh {
namespace {

std::string FamilyModel(const std::string& family) {
  return TinyModel("swap_preemption_test_tiny_" + family, 23, family);
}

std::unique_ptr<ColocatedBackend> Backend(int blocks, int block_size, Metrics* metrics,
                                          bool prefix_cache, int64_t swap_space_bytes,
                                          const std::string& family = "v3") {
  DecodeEngineOptions decode;
  decode.metrics = metrics;
  decode.preemption_mode = PreemptionMode::kSwap;
  decode.swap_space_bytes = swap_space_bytes;
  return NewColocated(FamilyModel(family), blocks, block_size, prefix_cache, decode);
}

// What a request streamed.
struct Streamed {
  absl::Status status;
  std::vector<int32_t> ids;
  std::vector<float> token_logprobs;
  std::vector<std::vector<TokenLogprob>> top;
};

Streamed Stream(ColocatedBackend* b, const GenerationRequest& r, const CancelToken& cancel,
                const std::function<void(const Streamed&)>& on_chunk = nullptr) {
  Streamed s;
  s.status = b->Run(
      r,
      [&](const TokenChunk& c) {
        s.ids.insert(s.ids.end(), c.ids.begin(), c.ids.end());
        s.token_logprobs.insert(s.token_logprobs.end(), c.token_logprobs.begin(),
                                c.token_logprobs.end());
        s.top.insert(s.top.end(), c.logprobs.begin(), c.logprobs.end());
        if (on_chunk) on_chunk(s);
        return true;
      },
      cancel);
  return s;
}

GenerationRequest Request(const std::string& id, std::vector<int32_t> prompt, int max_new_tokens,
                          bool sampled) {
  GenerationRequest r;
  r.request_id = id;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new_tokens;  // no stop ids: it runs to the end
  if (sampled) {
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = 1234;
  }
  r.sampling.logprobs = true;
  r.sampling.top_logprobs = 2;
  return r;
}

// Ids equal; log-probabilities equal (`exact`: bit for bit, as a swapped
// request's are, its rows and steps unchanged; else within 1e-4, as a
// recompute's are: its rows come from a pass over prompt + output, whose
// sums run in another order).
void ExpectSameStream(const Streamed& got, const Streamed& want, bool exact,
                      const std::string& what) {
  SCOPED_TRACE(what);
  const float tolerance = exact ? 0.0f : 1e-4f;
  EXPECT_EQ(got.ids, want.ids);
  ASSERT_EQ(got.token_logprobs.size(), want.token_logprobs.size());
  for (size_t i = 0; i < got.token_logprobs.size(); ++i)
    EXPECT_NEAR(got.token_logprobs[i], want.token_logprobs[i], tolerance) << i;
  ASSERT_EQ(got.top.size(), want.top.size());
  for (size_t i = 0; i < got.top.size(); ++i) {
    ASSERT_EQ(got.top[i].size(), want.top[i].size()) << i;
    for (size_t k = 0; k < got.top[i].size(); ++k) {
      EXPECT_EQ(got.top[i][k].id, want.top[i][k].id) << i;
      EXPECT_NEAR(got.top[i][k].logprob, want.top[i][k].logprob, tolerance) << i;
    }
  }
}

struct SwapCase {
  bool sampled;
  bool prefix_cache;
  bool tiny_swap_space;  // 1 byte: every swap falls back to recompute
  // V3.2 (its index keys in the cache rows) and V4 (its compressed entries
  // recomputed from the rows) swap their whole state too.
  std::string family = "v3";
};

class SwapPreemptionTest : public ::testing::TestWithParam<SwapCase> {};

TEST_P(SwapPreemptionTest, ASwappedRequestResumesTokenExact) {
  // 48 blocks of 4 tokens: one request of 3 + 150 tokens (38 blocks) fits,
  // two together do not, so the second to start (once the first streams)
  // makes the pool run dry and the later one is swapped out until the
  // earlier one ends.
  const SwapCase& c = GetParam();
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", "decode_worker");
  ASSERT_TRUE(metrics.ok());
  Metrics* m = metrics->get();
  std::unique_ptr<ColocatedBackend> b =
      Backend(48, 4, m, c.prefix_cache, c.tiny_swap_space ? 1 : int64_t{1} << 30, c.family);
  ASSERT_NE(b, nullptr);
  const int64_t all_free = b->decode()->Load().free_kv_blocks;
  constexpr int kNew = 150;
  const GenerationRequest first = Request("first", {5, 6, 7}, kNew, c.sampled);
  const GenerationRequest second = Request("second", {9, 300, 41}, kNew, c.sampled);
  CancelToken never;
  // Uninterrupted runs, one at a time.
  const Streamed want_first = Stream(b.get(), first, never);
  const Streamed want_second = Stream(b.get(), second, never);
  ASSERT_TRUE(want_first.status.ok()) << want_first.status;
  ASSERT_TRUE(want_second.status.ok()) << want_second.status;
  ASSERT_EQ(want_first.ids.size(), static_cast<size_t>(kNew));
  ASSERT_EQ(want_first.token_logprobs.size(), static_cast<size_t>(kNew));
  ASSERT_EQ(b->decode()->Load().preemptions, 0);
  const double alone_chunks = MetricSum(m, "moesh_decode_prompt_chunks_total");

  absl::Notification streaming;
  Streamed got_first;
  std::thread t([&] {
    got_first = Stream(b.get(), first, never, [&](const Streamed& s) {
      if (s.ids.size() >= 8 && !streaming.HasBeenNotified()) streaming.Notify();
    });
  });
  ASSERT_TRUE(streaming.WaitForNotificationWithTimeout(absl::Seconds(60)));
  const Streamed got_second = Stream(b.get(), second, never);
  t.join();
  ASSERT_TRUE(got_first.status.ok()) << got_first.status;
  ASSERT_TRUE(got_second.status.ok()) << got_second.status;
  EXPECT_GT(b->decode()->Load().preemptions, 0);
  ExpectSameStream(got_first, want_first, !c.tiny_swap_space, "first");
  ExpectSameStream(got_second, want_second, !c.tiny_swap_space, "second");
  ExpectIdle(b.get(), all_free);
  const double swapped = MetricSum(m, "moesh_decode_preemptions_total", "mode", "swap");
  const double recomputed = MetricSum(m, "moesh_decode_preemptions_total", "mode", "recompute");
  if (c.tiny_swap_space) {
    // Every preemption recomputed instead, counted as such.
    EXPECT_EQ(swapped, 0);
    EXPECT_GT(recomputed, 0);
    EXPECT_EQ(MetricSum(m, "moesh_decode_swap_fallbacks_total"), recomputed);
    EXPECT_EQ(MetricSum(m, "moesh_decode_swap_seconds"), 0);
  } else {
    // Swapped out and back in, nothing recomputed: no prompt chunk past
    // those of the prompts (as many as alone).
    EXPECT_GT(swapped, 0);
    EXPECT_EQ(recomputed, 0);
    EXPECT_EQ(MetricSum(m, "moesh_decode_swap_fallbacks_total"), 0);
    EXPECT_EQ(MetricSum(m, "moesh_decode_swap_seconds", "direction", "out"), swapped);
    EXPECT_EQ(MetricSum(m, "moesh_decode_swap_seconds", "direction", "in"), swapped);
    EXPECT_EQ(MetricSum(m, "moesh_decode_prompt_chunks_total"), 2 * alone_chunks);
  }
  EXPECT_EQ(MetricSum(m, "moesh_decode_swapped_bytes"), 0);
}

INSTANTIATE_TEST_SUITE_P(
    GreedyAndSeeded, SwapPreemptionTest,
    ::testing::Values(SwapCase{false, false, false}, SwapCase{true, false, false},
                      SwapCase{false, true, false}, SwapCase{true, true, false},
                      // Greedy: a recompute's logits differ in the
                      // last bits, which can flip a seeded draw.
                      SwapCase{false, false, true}, SwapCase{true, false, false, "v3.2"},
                      SwapCase{true, false, false, "v4"}),
    [](const ::testing::TestParamInfo<SwapCase>& info) {
      return absl::StrCat(info.param.family == "v3"   ? ""
                          : info.param.family == "v4" ? "v4_"
                                                      : "v3_2_",
                          info.param.sampled ? "seeded" : "greedy",
                          info.param.prefix_cache ? "_prefix_cache" : "",
                          info.param.tiny_swap_space ? "_no_swap_space" : "");
    });

class SwapCancellationTest : public ::testing::TestWithParam<bool> {};  // the prefix cache on

TEST_P(SwapCancellationTest, CancellingSwappedRequestsFreesTheirHostCopiesAndBlocks) {
  // 12 requests of up to 2002 tokens (126 blocks of 16) on 160 blocks: some
  // run, some are swapped out, some queue; cancelled, all of it comes back.
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", "decode_worker");
  ASSERT_TRUE(metrics.ok());
  Metrics* m = metrics->get();
  std::unique_ptr<ColocatedBackend> b = Backend(160, 16, m, GetParam(), int64_t{1} << 30);
  ASSERT_NE(b, nullptr);
  const int64_t all_free = b->decode()->Load().free_kv_blocks;
  constexpr int kRequests = 12;
  std::vector<std::unique_ptr<CancelToken>> cancel;
  std::vector<Streamed> got(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) cancel.push_back(std::make_unique<CancelToken>());
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      got[i] =
          Stream(b.get(), Request("c" + std::to_string(i), {7, 8, 9 + i}, 2000, false), *cancel[i]);
    });
  }
  // Until a swapped request holds host memory.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (MetricSum(m, "moesh_decode_swapped_bytes") <= 0 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_GT(MetricSum(m, "moesh_decode_swapped_bytes"), 0);
  for (auto& c : cancel) c->Cancel();
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i)
    EXPECT_EQ(got[i].status.code(), absl::StatusCode::kCancelled) << i << ": " << got[i].status;
  ExpectIdle(b.get(), all_free);
  EXPECT_GT(MetricSum(m, "moesh_decode_preemptions_total", "mode", "swap"), 0);
  EXPECT_EQ(MetricSum(m, "moesh_decode_swapped_bytes"), 0);
  EXPECT_EQ(MetricSum(m, "moesh_kv_cache_free_blocks"), all_free);
  EXPECT_EQ(MetricSum(m, "moesh_num_requests_running"), 0);
  EXPECT_EQ(MetricSum(m, "moesh_decode_num_requests_waiting"), 0);
}

INSTANTIATE_TEST_SUITE_P(SwapPreemption, SwapCancellationTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "prefix_cache" : "no_prefix_cache";
                         });

}  // namespace
}  // namespace moesh
