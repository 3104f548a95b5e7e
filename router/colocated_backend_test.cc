// The engines of this process through the request flow (the colocated
// backend): cancellation reaches the decode engine as an event, which drops
// the request and frees its KV blocks while other requests go on.
#include "router/colocated_backend.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/metrics/metrics.h"
#include "gtest/gtest.h"
#include "router/colocated_test_util.h"

namespace moesh {
namespace {

std::string TinyModel() { return moesh::TinyModel("colocated_backend_test_tiny_v3", 21); }

std::unique_ptr<ColocatedBackend> Backend() {
  return NewColocated(TinyModel(), 256, 16, false, DecodeEngineOptions());
}

GenerationRequest Request(const std::string& id, int max_new_tokens) {
  GenerationRequest r;
  r.request_id = id;
  r.prompt = {5, 6, 7};
  r.max_new_tokens = max_new_tokens;  // no stop ids: it runs to the end
  return r;
}

// Runs `r` to its end (or `cancel`); *tokens gets how many came.
absl::Status RunCounting(ColocatedBackend* b, const GenerationRequest& r, const CancelToken& cancel,
                         int* tokens) {
  *tokens = 0;
  return b->Run(
      r,
      [tokens](const TokenChunk& c) {
        *tokens += static_cast<int>(c.ids.size());
        return true;
      },
      cancel);
}

TEST(ColocatedBackendTest, CancellationReachesTheDecodeEngineWhileTheCallerIsBusy) {
  std::unique_ptr<ColocatedBackend> b = Backend();
  ASSERT_NE(b, nullptr);
  const int64_t all_free = b->decode()->Load().free_kv_blocks;
  ASSERT_GT(all_free, 0);

  // A long request whose caller is stuck in its sink (a slow client) from the
  // fifth token on; a short one runs beside it.
  constexpr int kLong = 2500;
  CancelToken cancel, never;
  int streamed = 0;
  absl::Notification streaming, unblock;
  absl::Status long_status;
  std::thread long_run([&] {
    long_status = b->Run(
        Request("long", kLong),
        [&](const TokenChunk& c) {
          streamed += static_cast<int>(c.ids.size());
          if (streamed >= 5 && !streaming.HasBeenNotified()) {
            streaming.Notify();
            unblock.WaitForNotificationWithTimeout(absl::Seconds(30));
          }
          return true;
        },
        cancel);
  });
  ASSERT_TRUE(streaming.WaitForNotificationWithTimeout(absl::Seconds(60)));
  int short_tokens = 0;
  const absl::Status short_status = RunCounting(b.get(), Request("short", 8), never, &short_tokens);
  EXPECT_TRUE(short_status.ok()) << short_status;
  EXPECT_EQ(short_tokens, 8);

  // The event: the engine drops the request and frees its blocks although
  // the caller's thread is still in its sink and looks at nothing.
  cancel.Cancel();
  ServingLoad load = b->decode()->Load();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while ((load.num_running != 0 || load.free_kv_blocks != all_free) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    load = b->decode()->Load();
  }
  EXPECT_EQ(load.num_running, 0);
  EXPECT_EQ(load.free_kv_blocks, all_free);
  unblock.Notify();
  long_run.join();
  EXPECT_EQ(long_status.code(), absl::StatusCode::kCancelled) << long_status;
  EXPECT_LT(streamed, kLong);
}

TEST(ColocatedBackendTest, ACancelledRequestNeverDecodesAndReleasesItsReservation) {
  std::unique_ptr<ColocatedBackend> b = Backend();
  ASSERT_NE(b, nullptr);
  const int64_t all_free = b->decode()->Load().free_kv_blocks;
  CancelToken cancel;
  cancel.Cancel();
  int tokens = 0;
  const absl::Status s = RunCounting(b.get(), Request("gone", 64), cancel, &tokens);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_EQ(tokens, 0);
  EXPECT_EQ(b->decode()->Load().free_kv_blocks, all_free);
  // The engines serve the next request as usual.
  CancelToken never;
  EXPECT_TRUE(b->Run(
                   Request("next", 4), [](const TokenChunk&) { return true; }, never)
                  .ok());
}

TEST(ColocatedBackendTest, TheFirstTokenEndsARequestOnTheDecodeSide) {
  // The first token reaches the decode engine with the KV; a request it ends
  // (one token asked for, or a stop id) finishes there and frees its blocks.
  std::unique_ptr<ColocatedBackend> b = Backend();
  ASSERT_NE(b, nullptr);
  const int64_t all_free = b->decode()->Load().free_kv_blocks;
  CancelToken never;
  auto run = [&](GenerationRequest r, std::vector<int32_t>* ids) {
    r.sampling.temperature = 0;  // greedy: the same first token every time
    return b->Run(
        r,
        [ids](const TokenChunk& c) {
          ids->insert(ids->end(), c.ids.begin(), c.ids.end());
          return true;
        },
        never);
  };
  std::vector<int32_t> three, one, stopped;
  ASSERT_TRUE(run(Request("three", 3), &three).ok());
  ASSERT_EQ(three.size(), 3u);
  ASSERT_TRUE(run(Request("one", 1), &one).ok());
  EXPECT_EQ(one, (std::vector<int32_t>{three[0]}));
  GenerationRequest stop = Request("stop", 8);
  stop.stop_token_ids = {three[0]};
  ASSERT_TRUE(run(stop, &stopped).ok());
  EXPECT_EQ(stopped, (std::vector<int32_t>{three[0]}));
  EXPECT_EQ(b->decode()->Load().free_kv_blocks, all_free);
  EXPECT_EQ(b->decode()->Load().num_running, 0);
}

TEST(ColocatedBackendTest, TheEnginesRefuseRequestIdsOutOfBounds) {
  // Internal RPCs are input too: the engines check the id the router checks.
  std::unique_ptr<ColocatedBackend> b = Backend();
  ASSERT_NE(b, nullptr);
  const int64_t all_free = b->decode()->Load().free_kv_blocks;
  for (const std::string& id : {std::string(), std::string(kMaxRequestIdBytes + 1, 'x')}) {
    int tokens = 0;
    const absl::Status s = RunCounting(b.get(), Request(id, 4), CancelToken(), &tokens);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find("request_id"), std::string::npos) << s;
    EXPECT_EQ(tokens, 0);
  }
  int tokens = 0;  // the bound itself is fine
  EXPECT_TRUE(
      RunCounting(b.get(), Request(std::string(kMaxRequestIdBytes, 'y'), 4), CancelToken(), &tokens)
          .ok());
  EXPECT_EQ(tokens, 4);
  EXPECT_EQ(b->decode()->Load().free_kv_blocks, all_free);
}

// Admission that queues and preemption by recompute, on the same engines: KV
// blocks are taken as tokens are produced, requests wait in a bounded queue
// ordered by (priority, arrival), a request preempted when the pool runs dry
// resumes token-exact, and every block comes back at the end.

std::unique_ptr<ColocatedBackend> Backend(int blocks, int block_size, int max_waiting = 1024,
                                          Metrics* metrics = nullptr, bool prefix_cache = false,
                                          int max_num_batched_tokens = 0) {
  DecodeEngineOptions decode;
  decode.max_waiting = max_waiting;
  decode.metrics = metrics;
  decode.max_num_batched_tokens = max_num_batched_tokens;
  return NewColocated(TinyModel(), blocks, block_size, prefix_cache, decode);
}

GenerationRequest Request(const std::string& id, std::vector<int32_t> prompt, int max_new_tokens,
                          int priority = 0) {
  GenerationRequest r;
  r.request_id = id;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new_tokens;  // no stop ids: it runs to the end
  r.priority = priority;
  return r;  // greedy
}

// Runs `r` to its end; *ids gets its tokens. `on_token` (may be null) runs
// after each chunk.
absl::Status RunRequest(ColocatedBackend* b, const GenerationRequest& r, std::vector<int32_t>* ids,
                        const CancelToken& cancel,
                        const std::function<void()>& on_token = nullptr) {
  return b->Run(
      r,
      [&](const TokenChunk& c) {
        ids->insert(ids->end(), c.ids.begin(), c.ids.end());
        if (on_token) on_token();
        return true;
      },
      cancel);
}

struct PreemptionCase {
  int first_priority;
  int second_priority;
  bool first_preempted;  // else the second
  // The victim resumes from the cached blocks of its own prompt + output
  // (and of the uninterrupted runs'), recomputing only the rest.
  bool prefix_cache = false;
};

class PreemptionTest : public ::testing::TestWithParam<PreemptionCase> {};

TEST_P(PreemptionTest, APreemptedRequestResumesTokenExact) {
  // 48 blocks of 4 tokens: one request of 3 + 150 tokens (38 blocks) fits,
  // two together do not, so the second to start (once the first streams)
  // makes the pool run dry and one of them is preempted by recompute.
  const PreemptionCase& c = GetParam();
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", "decode_worker");
  ASSERT_TRUE(metrics.ok());
  std::unique_ptr<ColocatedBackend> b = Backend(48, 4, 1024, metrics->get(), c.prefix_cache);
  ASSERT_NE(b, nullptr);
  const int64_t all_free = b->decode()->Load().free_kv_blocks;
  constexpr int kNew = 150;
  const GenerationRequest first = Request("first", {5, 6, 7}, kNew, c.first_priority);
  const GenerationRequest second = Request("second", {9, 300, 41}, kNew, c.second_priority);
  CancelToken never;
  // Uninterrupted runs, one at a time.
  std::vector<int32_t> want_first, want_second;
  ASSERT_TRUE(RunRequest(b.get(), first, &want_first, never).ok());
  ASSERT_TRUE(RunRequest(b.get(), second, &want_second, never).ok());
  ASSERT_EQ(want_first.size(), static_cast<size_t>(kNew));
  ASSERT_EQ(b->decode()->Load().preemptions, 0);

  // The second starts once the first streams; on a loaded machine its
  // thread may not run until the first has finished (then nothing is
  // preempted, both streams still exact): up to five tries for the overlap.
  std::vector<int32_t> got_first, got_second;
  for (int attempt = 0; attempt < 5; ++attempt) {
    SCOPED_TRACE(::testing::Message() << "attempt " << attempt);
    got_first.clear(), got_second.clear();
    const int64_t preempted_before = b->decode()->Load().preemptions;
    absl::Notification streaming;
    absl::Status first_status;
    std::atomic<int> ended{0};
    int first_rank = 0;
    std::thread t([&] {
      first_status = RunRequest(b.get(), first, &got_first, never, [&] {
        if (got_first.size() >= 8 && !streaming.HasBeenNotified()) streaming.Notify();
      });
      first_rank = ++ended;
    });
    ASSERT_TRUE(streaming.WaitForNotificationWithTimeout(absl::Seconds(60)));
    const absl::Status second_status = RunRequest(b.get(), second, &got_second, never);
    const int second_rank = ++ended;
    t.join();
    ASSERT_TRUE(first_status.ok()) << first_status;
    ASSERT_TRUE(second_status.ok()) << second_status;
    // Each stream is the uninterrupted one: no token lost, repeated or changed.
    EXPECT_EQ(got_first, want_first);
    EXPECT_EQ(got_second, want_second);
    if (b->decode()->Load().preemptions == preempted_before) continue;  // no overlap: again
    // The victim resumes only once the other finished (both never fit): it ends last.
    EXPECT_EQ(c.first_preempted ? first_rank : second_rank, 2);
    break;
  }
  ASSERT_GT(b->decode()->Load().preemptions, 0) << "the two requests never overlapped";
  ExpectIdle(b.get(), all_free);
  // With the cache, the uninterrupted runs' blocks (and its own) served the
  // victim's resume: it recomputed only what was evicted.
  if (c.prefix_cache)
    EXPECT_GT(MetricSum(metrics->get(), "moesh_prefix_cache_hit_tokens_total"), 0);
}

INSTANTIATE_TEST_SUITE_P(
    PriorityPicksTheVictim, PreemptionTest,
    ::testing::Values(PreemptionCase{0, 0, false},  // equal: the later arrival goes
                      PreemptionCase{0, 1, false},  // higher value: less important
                      PreemptionCase{1, 0, true},
                      PreemptionCase{0, 0, false, /*prefix_cache=*/true}),
    [](const ::testing::TestParamInfo<PreemptionCase>& info) {
      return absl::StrCat("priorities_", info.param.first_priority, "_", info.param.second_priority,
                          info.param.prefix_cache ? "_prefix_cache" : "");
    });

// The prefix cache: a chat's second turn starts with the first turn's prompt
// and output, whose blocks it reuses (usage.cached_tokens > 0), and its
// tokens equal those of a backend without the cache; under pool pressure
// cached blocks are evicted and outputs stay exact; every block comes back.

// Runs `r`; *ids gets its tokens, *cached the first chunk's cached_tokens.
absl::Status RunCounted(ColocatedBackend* b, const GenerationRequest& r, std::vector<int32_t>* ids,
                        int* cached) {
  CancelToken never;
  bool first = true;
  return b->Run(
      r,
      [&](const TokenChunk& c) {
        if (first) *cached = c.cached_tokens;
        first = false;
        ids->insert(ids->end(), c.ids.begin(), c.ids.end());
        return true;
      },
      never);
}

TEST(PrefixCacheTest, TheSecondTurnReusesTheFirstTurnsBlocksTokenExact) {
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", "decode_worker");
  ASSERT_TRUE(metrics.ok());
  std::unique_ptr<ColocatedBackend> on = Backend(64, 4, 1024, metrics->get(), true);
  std::unique_ptr<ColocatedBackend> off = Backend(64, 4);
  ASSERT_NE(on, nullptr);
  ASSERT_NE(off, nullptr);
  const int64_t all_free = on->decode()->Load().free_kv_blocks;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 21; ++i) prompt.push_back((i * 37 + 11) % 500);
  for (int turn = 1; turn <= 3; ++turn) {
    const GenerationRequest r = Request(absl::StrCat("turn", turn), prompt, 9);
    std::vector<int32_t> got, want;
    int cached = -1, cached_off = -1;
    ASSERT_TRUE(RunCounted(on.get(), r, &got, &cached).ok());
    ASSERT_TRUE(RunCounted(off.get(), r, &want, &cached_off).ok());
    EXPECT_EQ(got, want) << "turn " << turn;
    EXPECT_EQ(cached_off, 0);
    if (turn == 1) {
      EXPECT_EQ(cached, 0);
    } else {
      // The previous turn's prompt and output (all but its last token,
      // never fed) in whole blocks of 4.
      const int reusable = static_cast<int>(prompt.size()) - 4 - 1;
      EXPECT_GE(cached, reusable / 4 * 4) << "turn " << turn;
      EXPECT_LT(cached, static_cast<int>(prompt.size()));
    }
    ExpectIdle(on.get(), all_free);
    // The next turn: this prompt, the answer, a new user message.
    prompt.insert(prompt.end(), got.begin(), got.end());
    for (int i = 0; i < 4; ++i) prompt.push_back(100 + 7 * turn + i);
  }
  EXPECT_GT(MetricSum(metrics->get(), "moesh_prefix_cache_hit_tokens_total"), 0);
  EXPECT_GT(MetricSum(metrics->get(), "moesh_prefix_cache_miss_tokens_total"), 0);
  EXPECT_GT(MetricSum(metrics->get(), "moesh_prefix_cache_blocks"), 0);
}

// Prompt log-probabilities need every prompt position's logits: a prompt
// asking for them is computed whole, even where the cache holds its blocks,
// by the prefill engine and (chunked prefill: a token budget) by the decode
// engine.
class PromptLogprobsCacheTest : public ::testing::TestWithParam<int> {};
INSTANTIATE_TEST_SUITE_P(PrefixCacheTest, PromptLogprobsCacheTest, ::testing::Values(0, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param > 0 ? "chunked" : "prefill_engine";
                         });

TEST_P(PromptLogprobsCacheTest, PromptLogprobsCoverTheWholePromptOnACacheHit) {
  std::unique_ptr<ColocatedBackend> on = Backend(64, 4, 1024, nullptr, true, GetParam());
  std::unique_ptr<ColocatedBackend> off = Backend(64, 4, 1024, nullptr, false, GetParam());
  ASSERT_NE(on, nullptr);
  ASSERT_NE(off, nullptr);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 21; ++i) prompt.push_back((i * 37 + 11) % 500);
  std::vector<int32_t> ids;
  int cached = -1;
  ASSERT_TRUE(RunCounted(on.get(), Request("fill", prompt, 3), &ids, &cached).ok());
  GenerationRequest r = Request("again", prompt, 3);
  r.sampling.prompt_logprobs = 1;
  auto run = [&](ColocatedBackend* b, PromptLogprobs* got, int* cached_tokens) {
    CancelToken never;
    return b->Run(
        r,
        [&](const TokenChunk& c) {
          if (c.prompt_logprobs.has_value()) {
            *got = *c.prompt_logprobs;
            *cached_tokens = c.cached_tokens;
          }
          return true;
        },
        never);
  };
  PromptLogprobs got, want;
  int cached_on = -1, cached_off = -1;
  ASSERT_TRUE(run(on.get(), &got, &cached_on).ok());
  ASSERT_TRUE(run(off.get(), &want, &cached_off).ok());
  EXPECT_EQ(cached_on, 0) << "the prompt's blocks were reused: its logits were not computed";
  ASSERT_EQ(want.logprobs.size(), prompt.size() - 1);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t t = 0; t < want.logprobs.size(); ++t)
    EXPECT_NEAR(got.logprobs[t], want.logprobs[t], 1e-5) << t;
  ASSERT_EQ(got.top.size(), want.top.size());
  // Without prompt log-probabilities the same prompt hits the cache.
  ids.clear();
  ASSERT_TRUE(RunCounted(on.get(), Request("hit", prompt, 3), &ids, &cached).ok());
  EXPECT_GT(cached, 0);
}

TEST(PrefixCacheTest, CachedBlocksAreEvictedUnderPressureAndOutputsStayExact) {
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", "decode_worker");
  ASSERT_TRUE(metrics.ok());
  // 24 blocks of 4: each request holds up to 9 (prompt 22 + 12 new, twice
  // while prefill and decode both hold the prompt), so the cached blocks of
  // earlier prompts must make room for later ones.
  std::unique_ptr<ColocatedBackend> on = Backend(24, 4, 1024, metrics->get(), true);
  std::unique_ptr<ColocatedBackend> off = Backend(24, 4);
  ASSERT_NE(on, nullptr);
  ASSERT_NE(off, nullptr);
  const int64_t all_free = on->decode()->Load().free_kv_blocks;
  for (int round = 0; round < 2; ++round) {
    for (int p = 0; p < 4; ++p) {
      std::vector<int32_t> prompt;
      for (int i = 0; i < 22; ++i) prompt.push_back((i * 13 + p * 101 + 5) % 500);
      const GenerationRequest r = Request(absl::StrCat("r", round, "p", p), prompt, 12);
      std::vector<int32_t> got, want;
      int cached = -1, cached_off = -1;
      ASSERT_TRUE(RunCounted(on.get(), r, &got, &cached).ok());
      ASSERT_TRUE(RunCounted(off.get(), r, &want, &cached_off).ok());
      EXPECT_EQ(got, want) << "round " << round << " prompt " << p;
      ExpectIdle(on.get(), all_free);
    }
  }
  EXPECT_GT(MetricSum(metrics->get(), "moesh_prefix_cache_evictions_total"), 0);
  EXPECT_LE(MetricSum(metrics->get(), "moesh_prefix_cache_blocks"), 24);
}

TEST(AdmissionTest, ARequestLargerThanThePoolIsRefusedAtOnce) {
  std::unique_ptr<ColocatedBackend> b = Backend(16, 4);  // 64 tokens
  ASSERT_NE(b, nullptr);
  std::vector<int32_t> ids;
  const absl::Status s = RunRequest(b.get(), Request("huge", {1, 2, 3}, 100), &ids, CancelToken());
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_TRUE(ids.empty());
}

TEST(AdmissionTest, ManyLongRequestsOnASmallPoolAllComplete) {
  // 16 requests of 3 + 120 tokens on 64 blocks of 4 (~2 fit at full length):
  // none is refused; they queue, grow, preempt and resume.
  std::unique_ptr<ColocatedBackend> b = Backend(64, 4);
  ASSERT_NE(b, nullptr);
  const int64_t all_free = b->decode()->Load().free_kv_blocks;
  constexpr int kRequests = 16, kNew = 120;
  std::vector<std::vector<int32_t>> ids(kRequests);
  std::vector<absl::Status> status(kRequests);
  std::vector<std::thread> threads;
  CancelToken never;
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      status[i] = RunRequest(b.get(), Request("r" + std::to_string(i), {3, 4, 5 + i}, kNew),
                             &ids[i], never);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_TRUE(status[i].ok()) << i << ": " << status[i];
    EXPECT_EQ(ids[i].size(), static_cast<size_t>(kNew)) << i;
  }
  EXPECT_GT(b->decode()->Load().preemptions, 0);
  // A request preempted along the way equals its run alone.
  std::vector<int32_t> alone;
  ASSERT_TRUE(
      RunRequest(b.get(), Request("alone", {3, 4, 5 + kRequests - 1}, kNew), &alone, never).ok());
  EXPECT_EQ(alone, ids[kRequests - 1]);
  ExpectIdle(b.get(), all_free);
}

class CancellationTest : public ::testing::TestWithParam<bool> {};  // the prefix cache on

TEST_P(CancellationTest, CancellingQueuedRunningAndPreemptedRequestsFreesEveryBlock) {
  // 12 requests of up to 2002 tokens (126 blocks of 16) on 160 blocks; with
  // the prefix cache their shared blocks drop every reference too.
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create("", "decode_worker");
  ASSERT_TRUE(metrics.ok());
  std::unique_ptr<ColocatedBackend> b = Backend(160, 16, 1024, metrics->get(), GetParam());
  ASSERT_NE(b, nullptr);
  const int64_t all_free = b->decode()->Load().free_kv_blocks;
  constexpr int kRequests = 12;
  std::vector<std::unique_ptr<CancelToken>> cancel;
  std::vector<absl::Status> status(kRequests);
  std::vector<std::vector<int32_t>> ids(kRequests);
  std::atomic<int> tokens{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kRequests; ++i) cancel.push_back(std::make_unique<CancelToken>());
  for (int i = 0; i < kRequests; ++i) {
    threads.emplace_back([&, i] {
      status[i] = RunRequest(b.get(), Request("c" + std::to_string(i), {7, 8, 9 + i}, 2000),
                             &ids[i], *cancel[i], [&] { ++tokens; });
    });
  }
  // Until the pool ran dry at least once (some preempted, some queued).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (b->decode()->Load().preemptions == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_GT(b->decode()->Load().preemptions, 0);
  for (auto& c : cancel) c->Cancel();
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kRequests; ++i)
    EXPECT_EQ(status[i].code(), absl::StatusCode::kCancelled) << i << ": " << status[i];
  ExpectIdle(b.get(), all_free);
  // The gauges say so too.
  Metrics* m = metrics->get();
  EXPECT_EQ(MetricSum(m, "moesh_kv_cache_free_blocks"), all_free);
  EXPECT_EQ(MetricSum(m, "moesh_kv_cache_usage_perc"), 0);
  EXPECT_EQ(MetricSum(m, "moesh_num_requests_running"), 0);
  EXPECT_EQ(MetricSum(m, "moesh_decode_num_requests_waiting"), 0);
  EXPECT_GT(MetricSum(m, "moesh_decode_preemptions_total"), 0);
  // The blocks the requests filled stay cached, held by nobody (counted free above).
  if (GetParam()) EXPECT_GT(MetricSum(m, "moesh_prefix_cache_blocks"), 0);
}

INSTANTIATE_TEST_SUITE_P(AdmissionTest, CancellationTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "prefix_cache" : "no_prefix_cache";
                         });

TEST(AdmissionTest, TheQueueIsFcfsWithinAPriorityAndBoundedByMaxWaiting) {
  // Engine-level: reservations whose KV never comes hold their prompt blocks
  // (256 blocks of 16; a 1000-token prompt holds 63 and, colocated, admission
  // keeps as many free for its prefill), so three are admitted and the rest
  // queue: two may wait, the next is refused.
  std::unique_ptr<ColocatedBackend> b = Backend(256, 16, /*max_waiting=*/2);
  ASSERT_NE(b, nullptr);
  DecodeEngine* e = b->decode();
  const int64_t all_free = e->Load().free_kv_blocks;
  auto spec = [](const std::string& id, int priority) {
    DecodeSpec s;
    s.request_id = id;
    s.prompt_ids.assign(1000, 7);
    s.max_new_tokens = 8;
    s.priority = priority;
    return s;
  };
  std::vector<std::shared_ptr<DecodeEngine::Request>> held;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::shared_ptr<DecodeEngine::Request>> r =
        e->Reserve(spec("a" + std::to_string(i), 0));
    ASSERT_TRUE(r.ok()) << r.status();
    held.push_back(*r);
  }
  // Two queue (the later one more important), waiting in Reserve.
  CancelToken cancel_late, never;
  absl::StatusOr<std::shared_ptr<DecodeEngine::Request>> early, late;
  std::atomic<int> admitted_order{0};
  int early_rank = 0, late_rank = 0;
  std::thread te([&] {
    early = e->Reserve(spec("early", 0), &never);
    early_rank = ++admitted_order;
  });
  while (e->Load().num_waiting < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread tl([&] {
    late = e->Reserve(spec("late", -1), &cancel_late);
    late_rank = ++admitted_order;
  });
  while (e->Load().num_waiting < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The queue is full: the next is refused at once, saying why.
  absl::StatusOr<std::shared_ptr<DecodeEngine::Request>> refused = e->Reserve(spec("refused", 0));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_NE(refused.status().message().find("queue full"), std::string::npos);
  // Blocks come back: the more important request is admitted first.
  e->Release(held[0]);
  tl.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late_rank, 1);
  EXPECT_EQ(e->Load().num_waiting, 1);
  e->Release(held[1]);
  te.join();
  ASSERT_TRUE(early.ok()) << early.status();
  EXPECT_EQ(early_rank, 2);
  // A queued request cancelled leaves the queue with CANCELLED.
  CancelToken cancel_queued;
  absl::StatusOr<std::shared_ptr<DecodeEngine::Request>> queued;
  std::thread tq([&] { queued = e->Reserve(spec("queued", 0), &cancel_queued); });
  while (e->Load().num_waiting < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  cancel_queued.Cancel();
  tq.join();
  EXPECT_EQ(queued.status().code(), absl::StatusCode::kCancelled) << queued.status();
  for (auto& r : {held[2], *late, *early}) e->Release(r);
  ExpectIdle(b.get(), all_free);
}

}  // namespace
}  // namespace moesh
