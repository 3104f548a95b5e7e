// Chunked prefill in this process's engines (--max_num_batched_tokens), both
// places it runs: the colocated decode engine computing prompts in chunks
// mixed into its decode steps, and a prefill engine computing a long prompt
// over several passes. Greedy outputs (and log-probabilities) equal the
// unchunked engines' token for token while other requests decode beside
// them; cancelling a prompt between its chunks frees every KV block; a short
// prompt queued behind a long one gets its first token before the long one's
// last chunk.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/metrics/metrics.h"
#include "gtest/gtest.h"
#include "router/colocated_backend.h"
#include "router/colocated_test_util.h"

namespace moesh {
namespace {

constexpr int kBudget = 16;  // forces many chunks on prompts of 40..2000 tokens

std::string TinyModel() { return moesh::TinyModel("chunked_prefill_test_tiny_v3", 23); }

// Where the prompts are chunked.
enum class Where {
  kNone,          // the reference: prompts run whole in the prefill engine
  kDecodeSteps,   // the colocated decode engine's steps (no prefill engine)
  kPrefillPasses  // the prefill engine's passes
};

// `blocks` of `block_size` tokens; by default 8192 tokens: a prompt of 2000
// twice (the prefill engine's pass and the decode engine's reservation,
// kPrefillPasses).
std::unique_ptr<ColocatedBackend> Backend(Where where, Metrics* metrics = nullptr,
                                          bool prefix_cache = false, int blocks = 512,
                                          int block_size = 16) {
  DecodeEngineOptions decode;
  decode.metrics = metrics;
  decode.max_num_batched_tokens = where == Where::kDecodeSteps ? kBudget : 0;
  PrefillEngineOptions prefill;
  prefill.max_chunk_tokens = where == Where::kPrefillPasses ? kBudget : 0;
  return NewColocated(TinyModel(), blocks, block_size, prefix_cache, decode, prefill);
}

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(2 + (i * 37 + salt * 101) % 500);
  return p;
}

GenerationRequest Request(const std::string& id, std::vector<int32_t> prompt, int max_new_tokens) {
  GenerationRequest r;
  r.request_id = id;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new_tokens;  // greedy, no stop ids: it runs to the end
  return r;
}

// What a request streamed.
struct Streamed {
  absl::Status status;
  std::vector<int32_t> ids;
  std::vector<float> token_logprobs;
  std::vector<float> prompt_logprobs;
  std::vector<std::vector<TokenLogprob>> prompt_top;
  int cached_tokens = -1;
};

Streamed Stream(ColocatedBackend* b, const GenerationRequest& r, const CancelToken& cancel,
                const std::function<void(const Streamed&)>& on_chunk = nullptr) {
  Streamed s;
  s.status = b->Run(
      r,
      [&](const TokenChunk& c) {
        if (s.cached_tokens < 0) s.cached_tokens = c.cached_tokens;
        s.ids.insert(s.ids.end(), c.ids.begin(), c.ids.end());
        s.token_logprobs.insert(s.token_logprobs.end(), c.token_logprobs.begin(),
                                c.token_logprobs.end());
        if (c.prompt_logprobs.has_value()) {
          s.prompt_logprobs = c.prompt_logprobs->logprobs;
          s.prompt_top = c.prompt_logprobs->top;
        }
        if (on_chunk) on_chunk(s);
        return true;
      },
      cancel);
  return s;
}

const char* ChunksMetric(Where where) {
  return where == Where::kDecodeSteps ? "moesh_decode_prompt_chunks_total"
                                      : "moesh_prefill_chunks_total";
}

// Waits until `metrics`' chunk counter reaches `n`.
bool AwaitChunks(Metrics* metrics, Where where, double n) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (MetricSum(metrics, ChunksMetric(where)) < n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

struct Case {
  Where where;
  bool prefix_cache;
};

class ChunkedPrefillTest : public ::testing::TestWithParam<Case> {};

// The unchunked reference and the case's engines, with their metrics.
struct Engines {
  explicit Engines(const Case& c) {
    absl::StatusOr<std::unique_ptr<Metrics>> m = Metrics::Create("", "router");
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return;
    metrics = std::move(*m);
    ref = Backend(Where::kNone);
    b = Backend(c.where, metrics.get(), c.prefix_cache);
    if (b != nullptr) all_free = b->decode()->Load().free_kv_blocks;
  }
  bool ok() const { return metrics != nullptr && ref != nullptr && b != nullptr; }
  std::unique_ptr<Metrics> metrics;
  std::unique_ptr<ColocatedBackend> ref, b;
  int64_t all_free = 0;
};

TEST_P(ChunkedPrefillTest, OutputsEqualTheUnchunkedEnginesTokenForToken) {
  const Case c = GetParam();
  Engines e(c);
  ASSERT_TRUE(e.ok());
  ColocatedBackend* const ref = e.ref.get();
  ColocatedBackend* const b = e.b.get();
  Metrics* const metrics = e.metrics.get();
  const int64_t all_free = e.all_free;
  // A stream decoding throughout, then prompts of 100, 70, 5 and 40 tokens
  // (the last with prompt log-probabilities, in chunks too) and one sharing
  // the first's first 64 tokens (from the prefix cache where it is on).
  const GenerationRequest stream = Request("stream", Prompt(3, 0), 80);
  std::vector<GenerationRequest> prompts = {
      Request("long", Prompt(100, 1), 12), Request("mid", Prompt(70, 2), 9),
      Request("short", Prompt(5, 3), 7), Request("plp", Prompt(40, 4), 6)};
  prompts[3].sampling.prompt_logprobs = 2;
  prompts[3].sampling.logprobs = true;
  std::vector<int32_t> shared = Prompt(64, 1);
  for (int i = 0; i < 30; ++i) shared.push_back(400 + i);
  prompts.push_back(Request("shared", shared, 8));
  CancelToken never;
  const Streamed want_stream = Stream(ref, stream, never);
  ASSERT_TRUE(want_stream.status.ok()) << want_stream.status;
  std::vector<Streamed> want;
  for (const GenerationRequest& r : prompts) {
    want.push_back(Stream(ref, r, never));
    ASSERT_TRUE(want.back().status.ok()) << r.request_id << ": " << want.back().status;
  }
  ASSERT_EQ(want[3].prompt_logprobs.size(), 39u);

  absl::Notification streaming;
  Streamed got_stream;
  std::thread t([&] {
    got_stream = Stream(b, stream, never, [&](const Streamed& s) {
      if (s.ids.size() >= 3 && !streaming.HasBeenNotified()) streaming.Notify();
    });
  });
  ASSERT_TRUE(streaming.WaitForNotificationWithTimeout(absl::Seconds(60)));
  std::vector<Streamed> got(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i + 1 < prompts.size(); ++i)
    threads.emplace_back([&, i] { got[i] = Stream(b, prompts[i], never); });
  for (std::thread& th : threads) th.join();
  got.back() = Stream(b, prompts.back(), never);  // after "long": its blocks are cached
  t.join();
  ASSERT_TRUE(got_stream.status.ok()) << got_stream.status;
  EXPECT_EQ(got_stream.ids, want_stream.ids);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << prompts[i].request_id << ": " << got[i].status;
    EXPECT_EQ(got[i].ids, want[i].ids) << prompts[i].request_id;
  }
  // Log-probabilities as the unchunked prefill computed them (fp32 sums in
  // another order: close, not bit-equal).
  ASSERT_EQ(got[3].prompt_logprobs.size(), want[3].prompt_logprobs.size());
  for (size_t j = 0; j < want[3].prompt_logprobs.size(); ++j)
    EXPECT_NEAR(got[3].prompt_logprobs[j], want[3].prompt_logprobs[j], 1e-3) << j;
  ASSERT_EQ(got[3].token_logprobs.size(), want[3].token_logprobs.size());
  for (size_t j = 0; j < want[3].token_logprobs.size(); ++j)
    EXPECT_NEAR(got[3].token_logprobs[j], want[3].token_logprobs[j], 1e-3) << j;
  if (c.prefix_cache) {
    EXPECT_GE(got.back().cached_tokens, 64);  // "long"'s 4 full blocks of 16
  } else {
    EXPECT_EQ(got.back().cached_tokens, 0);
  }
  // The long prompts took many chunks: more than one per request.
  EXPECT_GT(MetricSum(metrics, ChunksMetric(c.where)), 2.0 * (prompts.size() + 1));
  ExpectIdle(b, all_free);
}

// Prompt log-probabilities in chunks: each chunk scores the tokens after its
// positions (its last, the next chunk's first); joined they equal the
// unchunked pass's. With the prefix cache on, a prompt asking for them reads
// no cached rows (cached_tokens 0) and gets every token's.
TEST_P(ChunkedPrefillTest, PromptLogprobsInChunksEqualTheUnchunkedOnes) {
  const Case c = GetParam();
  Engines e(c);
  ASSERT_TRUE(e.ok());
  ColocatedBackend* const ref = e.ref.get();
  ColocatedBackend* const b = e.b.get();
  Metrics* const metrics = e.metrics.get();
  const int64_t all_free = e.all_free;
  CancelToken never;
  // 100 tokens: 7 chunks of 16 (the last 4 tokens their own); 33: a chunk
  // boundary right before the last token; 16: one chunk.
  for (const int n : {100, 33, 16}) {
    GenerationRequest r = Request(absl::StrCat("plp", n), Prompt(n, 20 + n), 4);
    r.sampling.prompt_logprobs = 3;
    r.sampling.logprobs = true;
    const Streamed want = Stream(ref, r, never);
    ASSERT_TRUE(want.status.ok()) << want.status;
    ASSERT_EQ(want.prompt_logprobs.size(), static_cast<size_t>(n - 1));
    // The prompt's blocks cached first where the cache is on (a plain
    // request), then the one asking for log-probabilities.
    const double chunks_before = MetricSum(metrics, ChunksMetric(c.where));
    GenerationRequest plain = Request(absl::StrCat("plain", n), r.prompt, 1);
    ASSERT_TRUE(Stream(b, plain, never).status.ok());
    const Streamed got = Stream(b, r, never);
    ASSERT_TRUE(got.status.ok()) << n << ": " << got.status;
    EXPECT_EQ(got.cached_tokens, 0) << n;
    EXPECT_EQ(got.ids, want.ids) << n;
    // Equal up to fp32 rounding: the chunks' matrix products have other
    // shapes (16 rows, not the prompt's n), so their sums run in another
    // order; every token scored, with the same alternatives.
    double worst = 0;
    auto near = [&worst](float a, float b) { worst = std::max(worst, std::fabs(double(a) - b)); };
    ASSERT_EQ(got.prompt_logprobs.size(), want.prompt_logprobs.size()) << n;
    for (size_t j = 0; j < want.prompt_logprobs.size(); ++j)
      near(got.prompt_logprobs[j], want.prompt_logprobs[j]);
    ASSERT_EQ(got.prompt_top.size(), want.prompt_top.size()) << n;
    for (size_t j = 0; j < want.prompt_top.size(); ++j) {
      ASSERT_EQ(got.prompt_top[j].size(), 3u);
      for (int k = 0; k < 3; ++k) {
        EXPECT_EQ(got.prompt_top[j][k].id, want.prompt_top[j][k].id) << n << " " << j;
        near(got.prompt_top[j][k].logprob, want.prompt_top[j][k].logprob);
      }
    }
    ASSERT_EQ(got.token_logprobs.size(), want.token_logprobs.size()) << n;
    for (size_t j = 0; j < want.token_logprobs.size(); ++j)
      near(got.token_logprobs[j], want.token_logprobs[j]);
    EXPECT_LT(worst, 1e-5) << n;  // measured: at most 1e-6 (an ulp or two)
    // It ran in chunks: both requests' prompts, ceil(n / 16) each.
    EXPECT_EQ(MetricSum(metrics, ChunksMetric(c.where)) - chunks_before,
              2 * ((n + kBudget - 1) / kBudget))
        << n;
  }
  ExpectIdle(b, all_free);
}

TEST_P(ChunkedPrefillTest, CancellingAPromptBetweenItsChunksFreesEveryBlock) {
  const Case c = GetParam();
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", "router");
  ASSERT_TRUE(metrics.ok());
  std::unique_ptr<ColocatedBackend> b = Backend(c.where, metrics->get(), c.prefix_cache);
  ASSERT_NE(b, nullptr);
  const int64_t all_free = b->decode()->Load().free_kv_blocks;
  constexpr int kPrompt = 2000;  // 125 chunks of 16 (the tiny model's context: 2560)
  CancelToken cancel;
  Streamed got;
  std::thread t([&] { got = Stream(b.get(), Request("long", Prompt(kPrompt, 5), 4), cancel); });
  EXPECT_TRUE(AwaitChunks(metrics->get(), c.where, 3));
  cancel.Cancel();
  t.join();
  EXPECT_EQ(got.status.code(), absl::StatusCode::kCancelled) << got.status;
  EXPECT_TRUE(got.ids.empty());
  ExpectIdle(b.get(), all_free);
  // It stopped between its chunks, well before its last.
  const double chunks = MetricSum(metrics->get(), ChunksMetric(c.where));
  EXPECT_LT(chunks, kPrompt / kBudget);
  // The engine serves the next request as usual.
  CancelToken never;
  const Streamed next = Stream(b.get(), Request("next", Prompt(20, 6), 3), never);
  EXPECT_TRUE(next.status.ok()) << next.status;
  EXPECT_EQ(next.ids.size(), 3u);
  ExpectIdle(b.get(), all_free);
}

TEST_P(ChunkedPrefillTest, AShortPromptGetsItsFirstTokenBeforeALongPromptQueuedAheadOfIt) {
  const Case c = GetParam();
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", "router");
  ASSERT_TRUE(metrics.ok());
  std::unique_ptr<ColocatedBackend> b = Backend(c.where, metrics->get(), c.prefix_cache);
  ASSERT_NE(b, nullptr);
  constexpr int kPrompt = 2000;  // 125 chunks of 16 (the tiny model's context: 2560)
  CancelToken never;
  std::atomic<bool> long_done{false};
  Streamed long_got;
  std::thread t([&] {
    long_got = Stream(b.get(), Request("long", Prompt(kPrompt, 7), 1), never);
    long_done = true;
  });
  // The long prompt is on its way (2 chunks computed), then the short one comes.
  EXPECT_TRUE(AwaitChunks(metrics->get(), c.where, 2));
  const Streamed short_got = Stream(b.get(), Request("short", Prompt(4, 8), 1), never);
  const bool long_done_then = long_done;
  const double chunks_then = MetricSum(metrics->get(), ChunksMetric(c.where));
  t.join();
  ASSERT_TRUE(short_got.status.ok()) << short_got.status;
  ASSERT_TRUE(long_got.status.ok()) << long_got.status;
  // The short prompt's token came while the long one still had chunks to go.
  EXPECT_FALSE(long_done_then);
  EXPECT_LT(chunks_then, kPrompt / kBudget);
}

// A pool too small for the requests together: they queue, preempt and
// resume by recompute, both the prompts and the recomputes in chunks of 16,
// and every output equals the request's run alone.
TEST(ChunkedPrefillPreemptionTest, PreemptedRequestsResumeInChunksTokenExact) {
  // 8 requests of 40 + 100 tokens (35 blocks of 4 each) on 64 blocks.
  std::unique_ptr<ColocatedBackend> ref = Backend(Where::kNone);
  std::unique_ptr<ColocatedBackend> b = Backend(Where::kDecodeSteps, nullptr, false, 64, 4);
  ASSERT_NE(ref, nullptr);
  ASSERT_NE(b, nullptr);
  const int64_t all_free = b->decode()->Load().free_kv_blocks;
  constexpr int kRequests = 8, kNew = 100;
  CancelToken never;
  std::vector<Streamed> got(kRequests);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      got[i] = Stream(b.get(), Request(absl::StrCat("r", i), Prompt(40, 10 + i), kNew), never);
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GT(b->decode()->Load().preemptions, 0);
  for (int i = 0; i < kRequests; ++i) {
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status;
    const Streamed alone =
        Stream(ref.get(), Request(absl::StrCat("a", i), Prompt(40, 10 + i), kNew), never);
    EXPECT_EQ(got[i].ids, alone.ids) << i;
  }
  ExpectIdle(b.get(), all_free);
}

INSTANTIATE_TEST_SUITE_P(
    InDecodeStepsAndPrefillPasses, ChunkedPrefillTest,
    ::testing::Values(Case{Where::kDecodeSteps, false}, Case{Where::kDecodeSteps, true},
                      Case{Where::kPrefillPasses, false}, Case{Where::kPrefillPasses, true}),
    [](const ::testing::TestParamInfo<Case>& info) {
      return absl::StrCat(
          info.param.where == Where::kDecodeSteps ? "decode_steps" : "prefill_passes",
          info.param.prefix_cache ? "_prefix_cache" : "");
    });

}  // namespace
}  // namespace moesh
