// Cancellation through the request flow onto the engines of this process (the
// colocated backend): the caller's CancelToken reaches the decode engine as an
// event, which drops the request and frees its KV blocks; other requests go on.
#include "router/colocated_backend.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/synchronization/notification.h"
#include "base/file_util.h"
#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

std::string TinyModel() {
  static const std::string dir = [] {
    const std::string d = JoinPath(::testing::TempDir(), "colocated_backend_test_tiny_v3");
    std::filesystem::remove_all(d);
    absl::StatusOr<ModelConfig> c = PresetConfig("v3", "tiny");
    RandomCheckpointOptions opt;
    opt.seed = 21;
    EXPECT_TRUE(c.ok() && WriteRandomCheckpoint(*c, d, opt).ok());
    return d;
  }();
  return dir;
}

std::unique_ptr<ColocatedBackend> Backend() {
  DeviceOptions device;
  device.num_kv_blocks = 256;
  device.block_size = 16;
  absl::StatusOr<std::unique_ptr<ColocatedBackend>> b =
      ColocatedBackend::Create(TinyModel(), device, DecodeEngineOptions(), PrefillEngineOptions());
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
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

}  // namespace
}  // namespace moesh
