// Every Cluster RPC field a peer sends, refused out of range with a message
// naming the field (router/cluster_validation.h); well-formed requests pass.
#include "router/cluster_validation.h"

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/engine/paged_kv_cache.h"
#include "common/serving/serving_load.h"
#include "gtest/gtest.h"
#include "router/cluster_backend.h"

namespace moesh {
namespace {

ClusterLimits Limits() {
  ClusterLimits l;
  l.num_experts = 8;
  return l;
}

v1::RegisterRequest Expert(std::vector<int> ids) {
  v1::RegisterRequest r;
  r.set_kind(v1::WORKER_KIND_EXPERT);
  r.set_address("127.0.0.1:5");
  r.set_model_fingerprint("fp");
  r.mutable_expert_ids()->Add(ids.begin(), ids.end());
  return r;
}

// A request spoiled one field at a time: each is INVALID_ARGUMENT whose
// message starts with the field's name.
template <typename Request>
struct Spoiled {
  const char* field;
  std::function<void(Request*)> spoil;
};
template <typename Request, typename Validate>
void ExpectEachRefused(const Request& good, const std::vector<Spoiled<Request>>& cases,
                       Validate validate) {
  ASSERT_TRUE(validate(good).ok());
  for (const Spoiled<Request>& c : cases) {
    Request r = good;
    c.spoil(&r);
    const absl::Status s = validate(r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(s.message().find(c.field), 0u) << s;
  }
}

TEST(ClusterValidationTest, HostPort) {
  for (const char* ok : {"127.0.0.1:5", "expert-0.moesh.svc:50051", "[::1]:80", "a_b:65535"}) {
    EXPECT_TRUE(ValidateHostPort("address", ok).ok()) << ok;
  }
  for (const char* bad : {"", "garbage::::", "host", "host:", "host:0", "host:65536", ":80",
                          "host:+80", "host: 80", "[::1:80", "a b:80", "[zz]:80"}) {
    const absl::Status s = ValidateHostPort("address", bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("address"), std::string::npos) << s;
  }
  EXPECT_FALSE(ValidateHostPort("address", std::string(300, 'a') + ":80").ok());
}

TEST(ClusterValidationTest, Registration) {
  const ClusterLimits l = Limits();
  const std::vector<Spoiled<v1::RegisterRequest>> cases = {
      {"kind", [](v1::RegisterRequest* r) { r->set_kind(static_cast<v1::WorkerKind>(99)); }},
      {"kind", [](v1::RegisterRequest* r) { r->set_kind(v1::WORKER_KIND_UNSPECIFIED); }},
      {"address", [](v1::RegisterRequest* r) { r->set_address("garbage::::"); }},
      {"data_plane_address", [](v1::RegisterRequest* r) { r->set_data_plane_address("x"); }},
      {"expert_ids", [](v1::RegisterRequest* r) { r->set_expert_ids(0, -3000000); }},
      {"expert_ids", [](v1::RegisterRequest* r) { r->set_expert_ids(0, 1000000000); }},
      {"expert_ids", [](v1::RegisterRequest* r) { r->set_expert_ids(0, 8); }},
      {"expert_ids", [](v1::RegisterRequest* r) { r->set_expert_ids(0, 7); }},  // twice
      {"expert_ids", [](v1::RegisterRequest* r) { r->clear_expert_ids(); }},
      {"expert_ids", [](v1::RegisterRequest* r) { r->set_kind(v1::WORKER_KIND_DECODE); }},
      {"expert_ids",
       [](v1::RegisterRequest* r) {
         for (int i = 0; i < 1000; ++i) r->add_expert_ids(i % 8);
       }},
      {"model_fingerprint",
       [](v1::RegisterRequest* r) { r->set_model_fingerprint(std::string(5000, 'x')); }},
      {"computes_prompts", [](v1::RegisterRequest* r) { r->set_computes_prompts(true); }},
  };
  ExpectEachRefused(Expert({0, 7}), cases,
                    [&](const v1::RegisterRequest& r) { return ValidateRegistration(r, l); });
}

TEST(ClusterValidationTest, HeartbeatLoads) {
  const ClusterLimits l = Limits();
  v1::HeartbeatRequest good;
  good.set_worker_id("DECODE-00ff");
  good.mutable_load()->set_kv_usage(0.5f);
  good.mutable_load()->add_expert_tokens(3);
  good.mutable_load()->add_cached_block_hashes(0x1234);
  good.mutable_load()->set_cache_block_size(16);
  good.mutable_load()->add_hosted_expert_ids(2);
  const std::vector<Spoiled<v1::HeartbeatRequest>> cases = {
      {"load.cached_block_hashes",
       [](v1::HeartbeatRequest* r) {
         for (int i = 0; i < kMaxReportedBlockHashes; ++i)
           r->mutable_load()->add_cached_block_hashes(i);
       }},
      {"load.cache_block_size",
       [](v1::HeartbeatRequest* r) { r->mutable_load()->set_cache_block_size(0); }},
      {"load.cache_block_size",
       [](v1::HeartbeatRequest* r) { r->mutable_load()->set_cache_block_size(-4); }},
      {"load.cache_block_size",
       [](v1::HeartbeatRequest* r) { r->mutable_load()->set_cache_block_size(1 << 20); }},
      {"load.kv_usage", [](v1::HeartbeatRequest* r) { r->mutable_load()->set_kv_usage(-1); }},
      {"load.kv_usage", [](v1::HeartbeatRequest* r) { r->mutable_load()->set_kv_usage(1.5f); }},
      {"load.kv_usage", [](v1::HeartbeatRequest* r) { r->mutable_load()->set_kv_usage(NAN); }},
      {"load.queued_prompt_tokens",
       [](v1::HeartbeatRequest* r) { r->mutable_load()->set_queued_prompt_tokens(-1); }},
      {"load.queued_prompt_tokens",
       [](v1::HeartbeatRequest* r) { r->mutable_load()->set_queued_prompt_tokens(INT64_MAX); }},
      {"load.num_running", [](v1::HeartbeatRequest* r) { r->mutable_load()->set_num_running(-1); }},
      {"load.free_kv_blocks",
       [](v1::HeartbeatRequest* r) { r->mutable_load()->set_free_kv_blocks(-5); }},
      {"load.expert_tokens",
       [](v1::HeartbeatRequest* r) { r->mutable_load()->set_expert_tokens(0, -1); }},
      {"load.expert_tokens",
       [](v1::HeartbeatRequest* r) {
         for (int i = 0; i < 8; ++i) r->mutable_load()->add_expert_tokens(1);
       }},
      {"load.hosted_expert_ids",
       [](v1::HeartbeatRequest* r) { r->mutable_load()->add_hosted_expert_ids(8); }},
      {"load.hosted_expert_ids",
       [](v1::HeartbeatRequest* r) { r->mutable_load()->add_hosted_expert_ids(-1); }},
      {"load.hosted_expert_ids",
       [](v1::HeartbeatRequest* r) { r->mutable_load()->add_hosted_expert_ids(2); }},
      {"load.hosted_expert_ids",
       [](v1::HeartbeatRequest* r) {
         for (int i = 0; i < 8; ++i) r->mutable_load()->add_hosted_expert_ids(i);
       }},
      {"placement_version", [](v1::HeartbeatRequest* r) { r->set_placement_version(-2); }},
      {"worker_id", [](v1::HeartbeatRequest* r) { r->set_worker_id(std::string(200, 'x')); }},
      {"worker_id", [](v1::HeartbeatRequest* r) { r->clear_worker_id(); }},
  };
  ExpectEachRefused(good, cases,
                    [&](const v1::HeartbeatRequest& r) { return ValidateHeartbeat(r, l); });
}

TEST(ClusterValidationTest, SlotsPerWorker) {
  const ClusterLimits l = Limits();
  for (int ok : {0, 1, 8}) EXPECT_TRUE(ValidateSlotsPerWorker(ok, l).ok()) << ok;
  for (int64_t bad : {int64_t{-1}, int64_t{9}, int64_t{2147483647}}) {
    const absl::Status s = ValidateSlotsPerWorker(bad, l);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(s.message().find("slots_per_worker"), 0u) << s;
  }
}

// KV-aware routing over the (validated) reports: the prefill worker whose
// prefix cache holds the prompt's longest prefix wins unless its queue costs
// more than the cache saves; lies about the cache only draw prompts.
TEST(KvAwareRoutingTest, PicksTheLongestCachedPrefixBalancedAgainstTheQueue) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(i * 7 % 100);
  const std::vector<uint64_t> hashes = PrefixBlockHashes(prompt, 16);  // 4 full blocks
  std::vector<WorkerInfo> w(3);
  for (int i = 0; i < 3; ++i) w[i].id = absl::StrCat("p", i);
  w[1].load.set_cache_block_size(16);
  w[1].load.add_cached_block_hashes(hashes[0]);
  w[1].load.add_cached_block_hashes(hashes[1]);
  w[2].load.set_cache_block_size(16);
  for (uint64_t h : hashes) w[2].load.add_cached_block_hashes(h);
  PromptBlockHashes p(prompt);
  EXPECT_EQ(CachedPrefixTokens(w[0].load, &p), 0);
  EXPECT_EQ(CachedPrefixTokens(w[1].load, &p), 32);
  EXPECT_EQ(CachedPrefixTokens(w[2].load, &p), 64);
  // A block without its parent does not count: prefixes match from the start.
  v1::WorkerLoad gap;
  gap.set_cache_block_size(16);
  gap.add_cached_block_hashes(hashes[1]);
  EXPECT_EQ(CachedPrefixTokens(gap, &p), 0);
  // The whole prompt cached still leaves its last token to compute.
  PromptBlockHashes first64(absl::MakeConstSpan(prompt).subspan(0, 64));
  EXPECT_EQ(CachedPrefixTokens(w[2].load, &first64), 48);

  EXPECT_EQ(PickPrefillWorker(w, &p, RoutingPolicy::kKvAware, 0), 2u);
  EXPECT_EQ(PickPrefillWorker(w, &p, RoutingPolicy::kLoad, 0), 0u);  // all queues empty: the first
  // The longest prefix's worker is busy: 64 cached tokens do not make up
  // for 100 queued ones; the next best (32 cached, 10 queued) does.
  w[2].load.set_queued_prompt_tokens(100);
  w[1].load.set_queued_prompt_tokens(10);
  EXPECT_EQ(PickPrefillWorker(w, &p, RoutingPolicy::kKvAware, 0), 1u);
  EXPECT_EQ(PickPrefillWorker(w, &p, RoutingPolicy::kLoad, 0), 0u);
  // Round robin takes them in turn, whatever they hold or queue.
  for (uint64_t turn = 0; turn < 6; ++turn)
    EXPECT_EQ(PickPrefillWorker(w, &p, RoutingPolicy::kRoundRobin, turn), turn % 3);
  // Every report (three workers, asked five times) was of one block size:
  // the prompt was hashed once.
  EXPECT_EQ(p.computed(), 1);
  // A report of another block size hashes it once more.
  w[0].load.set_cache_block_size(8);
  w[0].load.add_cached_block_hashes(PrefixBlockHashes(prompt, 8)[0]);
  EXPECT_EQ(CachedPrefixTokens(w[0].load, &p), 8);
  EXPECT_EQ(p.computed(), 2);
  // A prompt nobody caches goes to the shortest queue.
  const std::vector<int32_t> other(70, 3);
  PromptBlockHashes o(other);
  EXPECT_EQ(PickPrefillWorker(w, &o, RoutingPolicy::kKvAware, 0), 0u);
}

// The decode worker: the longest cached prefix among those whose KV usage is
// within kKvAwareDecodeUsageSlack of the least used; a much fuller pool does
// not draw the request by its cache; without kv_aware, usage then running.
TEST(KvAwareRoutingTest, OrdersDecodeWorkersByCacheWithinTheUsageSlack) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 70; ++i) prompt.push_back(i * 7 % 100);
  const std::vector<uint64_t> hashes = PrefixBlockHashes(prompt, 16);
  std::vector<WorkerInfo> w(4);
  for (int i = 0; i < 4; ++i) w[i].id = absl::StrCat("d", i);
  w[0].load.set_kv_usage(0.20f);  // the least used, caches nothing
  w[1].load.set_kv_usage(0.25f);  // within the slack, caches 2 blocks
  w[1].load.set_cache_block_size(16);
  w[1].load.add_cached_block_hashes(hashes[0]);
  w[1].load.add_cached_block_hashes(hashes[1]);
  w[2].load.set_kv_usage(0.28f);  // within the slack, caches 1 block, fewer running than 3
  w[2].load.set_cache_block_size(16);
  w[2].load.add_cached_block_hashes(hashes[0]);
  w[3].load.set_kv_usage(0.60f);  // caches all of it, but far fuller
  w[3].load.set_cache_block_size(16);
  for (uint64_t h : hashes) w[3].load.add_cached_block_hashes(h);
  auto ids = [](const std::vector<WorkerInfo>& v) {
    std::vector<std::string> out;
    for (const WorkerInfo& x : v) out.push_back(x.id);
    return out;
  };
  PromptBlockHashes p(prompt);
  std::vector<WorkerInfo> order = w;
  OrderDecodeWorkers(&order, &p, RoutingPolicy::kKvAware, 0);
  EXPECT_EQ(ids(order), (std::vector<std::string>{"d1", "d2", "d0", "d3"}));
  EXPECT_EQ(p.computed(), 1);
  order = w;
  OrderDecodeWorkers(&order, &p, RoutingPolicy::kLoad, 0);
  EXPECT_EQ(ids(order), (std::vector<std::string>{"d0", "d1", "d2", "d3"}));
  // Nothing cached anywhere: load order either way.
  const std::vector<int32_t> other(70, 3);
  PromptBlockHashes o(other);
  order = w;
  OrderDecodeWorkers(&order, &o, RoutingPolicy::kKvAware, 0);
  EXPECT_EQ(ids(order), (std::vector<std::string>{"d0", "d1", "d2", "d3"}));
  // Round robin: the list as given, rotated by the turn, whatever the loads.
  order = w;
  OrderDecodeWorkers(&order, &p, RoutingPolicy::kRoundRobin, 5);
  EXPECT_EQ(ids(order), (std::vector<std::string>{"d1", "d2", "d3", "d0"}));
  // A report outside [0, 1] ranks as the fullest, whatever it caches.
  w[3].load.set_kv_usage(-1.0f);
  order = w;
  OrderDecodeWorkers(&order, &p, RoutingPolicy::kKvAware, 0);
  EXPECT_EQ(order.back().id, "d3");
}

TEST(KvAwareRoutingTest, ParsesThePolicyNames) {
  for (RoutingPolicy p :
       {RoutingPolicy::kKvAware, RoutingPolicy::kLoad, RoutingPolicy::kRoundRobin}) {
    absl::StatusOr<RoutingPolicy> parsed = ParseRoutingPolicy(RoutingPolicyName(p));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, p);
  }
  const absl::StatusOr<RoutingPolicy> bad = ParseRoutingPolicy("random");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("round_robin"), absl::string_view::npos) << bad.status();
}

}  // namespace
}  // namespace moesh
