// The prefix cache and KV-aware routing in the real cluster (LocalCluster:
// router, two prefill workers, a decode worker and expert workers as
// processes): a chat's later turns take their history's KV from the cache of
// the prefill worker that computed it (the router sends them there by the
// block hashes it reports), compute only the rest, and answer exactly as the
// single-process engine does; the decode worker starts them from its own
// cache too, and the KV handoff brings only the rows it lacks; every KV block
// is free again at the end.
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cli/local_cluster.h"
#include "common/engine/attention_backend.h"
#include "common/engine/generate.h"
#include "common/model/model.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace moesh {
namespace {

// Two prefill workers and a decode worker caching 16-token blocks.
LocalClusterOptions TwoPrefillWorkers(const std::string& dir, const std::string& name) {
  LocalClusterOptions o = Options(dir, name);
  o.num_prefill = 2;
  o.prefill.kv.block_size = 16;
  o.decode.kv.block_size = 16;
  return o;
}

TEST(PrefixCacheClusterTest, LaterTurnsReuseTheirHistoryOnOnePrefillWorkerTokenExact) {
  const std::string dir = TinyModel();
  LocalClusterOptions o = TwoPrefillWorkers(dir, "prefix_cache");
  o.router.heartbeat_interval_ms = 100;  // the caches' hashes reach the router sooner
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(dir);
  ASSERT_TRUE(model.ok());
  const std::string p0 = Proc(**cluster, "prefill-0").metrics_address;
  const std::string p1 = Proc(**cluster, "prefill-1").metrics_address;
  const std::string d0 = Proc(**cluster, "decode-0").metrics_address;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(2 + (i * 53) % 500);
  auto kv_bytes = [&] {
    return Metric(p0, "moesh_kv_transfer_bytes_total") +
           Metric(p1, "moesh_kv_transfer_bytes_total");
  };
  double row_bytes = 0;  // one token's rows, every layer (turn 1 sends them all)
  for (int turn = 1; turn <= 3; ++turn) {
    const double sent_before = kv_bytes();
    const Result r = Call((*cluster)->router_address(), Request(prompt, 8));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids, Offline(**model, prompt, 8).output_ids) << "turn " << turn;
    if (turn == 1) {
      EXPECT_EQ(r.final.usage().cached_tokens(), 0);
    } else {
      // The previous prompt's full blocks of 16, at least.
      EXPECT_GE(r.final.usage().cached_tokens(), 32) << "turn " << turn;
      EXPECT_LT(r.final.usage().cached_tokens(), static_cast<int>(prompt.size()));
    }
    // The KV handoff: every row on turn 1; later, only the rows past the
    // decode worker's own cached blocks (the last turn's prompt and answer).
    const double sent = kv_bytes() - sent_before;
    if (turn == 1) {
      row_bytes = sent / static_cast<double>(prompt.size());
      EXPECT_GT(row_bytes, 0);
    } else {
      const double held = static_cast<double>(prompt.size()) - sent / row_bytes;
      EXPECT_GE(held, 32) << "turn " << turn << ": " << sent << " bytes sent";
      EXPECT_EQ(static_cast<int>(held) % 16, 0) << "turn " << turn << ": whole blocks held";
    }
    prompt.insert(prompt.end(), r.ids.begin(), r.ids.end());
    for (int i = 0; i < 6; ++i) prompt.push_back(7 + turn * 11 + i);
    // The heartbeats carry the new blocks' hashes to the router.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  // One prefill worker served the chat; its cache saved tokens.
  const double hits0 = Metric(p0, "moesh_prefix_cache_hit_tokens_total");
  const double hits1 = Metric(p1, "moesh_prefix_cache_hit_tokens_total");
  EXPECT_GT(hits0 + hits1, 0);
  EXPECT_EQ(
      std::min(Metric(p0, "moesh_prompt_tokens_total"), Metric(p1, "moesh_prompt_tokens_total")),
      0);
  EXPECT_GT(Metric(p0, "moesh_prefix_cache_blocks") + Metric(p1, "moesh_prefix_cache_blocks"), 0);
  EXPECT_GT(Metric(d0, "moesh_prefix_cache_hit_tokens_total"), 0);
  // Every decode block is free again (cached ones count as free).
  double free_blocks = -1;
  for (int i = 0; i < 100 && free_blocks != o.decode.kv.kv_blocks; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    free_blocks = Metric(d0, "moesh_kv_cache_free_blocks");
  }
  EXPECT_EQ(free_blocks, o.decode.kv.kv_blocks);
}

// The baseline policy: round robin sends a chat's turns to the two prefill
// workers in turn, so a turn finds its history cached only when it lands
// where an earlier turn ran (turn 3, on turn 1's worker), never on turn 2;
// the answers are the same tokens.
TEST(PrefixCacheClusterTest, RoundRobinAlternatesPrefillWorkersAndMissesTheirCaches) {
  const std::string dir = TinyModel();
  LocalClusterOptions o = TwoPrefillWorkers(dir, "prefix_cache_rr");
  o.decode.kv.enable_prefix_caching = false;  // the prefill workers' caches alone
  o.router.routing_policy = RoutingPolicy::kRoundRobin;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(dir);
  ASSERT_TRUE(model.ok());
  const std::string p0 = Proc(**cluster, "prefill-0").metrics_address;
  const std::string p1 = Proc(**cluster, "prefill-1").metrics_address;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(2 + (i * 53) % 500);
  std::vector<int> cached;
  for (int turn = 1; turn <= 3; ++turn) {
    const Result r = Call((*cluster)->router_address(), Request(prompt, 8));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids, Offline(**model, prompt, 8).output_ids) << "turn " << turn;
    cached.push_back(r.final.usage().cached_tokens());
    prompt.insert(prompt.end(), r.ids.begin(), r.ids.end());
    for (int i = 0; i < 6; ++i) prompt.push_back(7 + turn * 11 + i);
  }
  EXPECT_EQ(cached[0], 0);
  EXPECT_EQ(cached[1], 0) << "turn 2 went to the other prefill worker";
  EXPECT_GE(cached[2], 32) << "turn 3 came back to turn 1's worker";
  // Both workers computed prompts.
  EXPECT_GT(Metric(p0, "moesh_prompt_tokens_total"), 0);
  EXPECT_GT(Metric(p1, "moesh_prompt_tokens_total"), 0);
}

// --kv_cache_dtype fp8 on every attention worker: a request's rows are FP8
// wherever they are computed, so the cluster (prefill worker, KV handoff,
// decode worker, second turn from the prefix cache) equals one CPU backend
// with the FP8 cache, token for token; and differs from the float cache's
// output somewhere (the flag is not ignored). V3 and V3.2 (its rows' index
// keys ride along unquantized).
class Fp8KvClusterTest : public ::testing::TestWithParam<std::string> {};

TEST_P(Fp8KvClusterTest, Fp8KvCacheAcrossTheHandoffEqualsOneFp8Backend) {
  const std::string family = GetParam();
  const std::string dir =
      family == "v3" ? TinyModel() : WriteTinyModel("tiny_" + family, false, family);
  LocalClusterOptions o = Options(dir, "kv_fp8_" + family);
  o.prefill.device.fp8_kv_cache = true;
  o.decode.device.fp8_kv_cache = true;
  o.decode.kv.block_size = 8;
  o.prefill.kv.block_size = 8;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(dir);
  ASSERT_TRUE(model.ok());
  std::unique_ptr<AttentionBackend> reference = NewCpuAttentionBackend(
      &(*model)->attention(), 0, 64, false, KvRowFormat::Fp8((*model)->config()));
  SamplingParams greedy;
  StopParams stop;
  stop.max_new_tokens = 24;
  stop.ignore_eos = true;
  bool differs = false;
  std::vector<int32_t> prompt;
  for (int i = 0; i < 30; ++i) prompt.push_back(2 + (i * 37) % 500);
  for (int turn = 1; turn <= 2; ++turn) {
    absl::StatusOr<GenerationResult> want =
        Generate(reference.get(), (*model)->experts(), prompt, greedy, stop);
    ASSERT_TRUE(want.ok()) << want.status();
    const Result r = Call((*cluster)->router_address(), Request(prompt, 24));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.ids, want->output_ids) << "turn " << turn;
    differs = differs || r.ids != Offline(**model, prompt, 24).output_ids;
    if (turn == 2) EXPECT_GE(r.final.usage().cached_tokens(), 24) << "turn 2 from the cache";
    prompt.insert(prompt.end(), r.ids.begin(), r.ids.end());
    prompt.push_back(9);
  }
  EXPECT_TRUE(differs) << "FP8 and float caches gave the same tokens on every turn";
}

INSTANTIATE_TEST_SUITE_P(Families, Fp8KvClusterTest, ::testing::Values("v3", "v3.2"),
                         [](const auto& info) { return info.param == "v3" ? "v3" : "v32"; });

}  // namespace
}  // namespace moesh
