// Dispatches for the same layer that arrive together are merged into one
// grouped computation, and each caller still gets exactly its own result.
#include "expert_worker/expert_service.h"

#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "base/file_util.h"
#include "common/model/random_checkpoint.h"
#include "common/model/safetensors.h"
#include "common/transport/dispatch_wire.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

class ExpertServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = JoinPath(::testing::TempDir(), "expert_service_test");
    absl::StatusOr<ModelConfig> c = PresetConfig("v3", "tiny");
    ASSERT_TRUE(WriteRandomCheckpoint(*c, dir, {}).ok());
    config_ = *c;
    ckpt_ = *Checkpoint::Open(dir);
  }
  std::unique_ptr<ExpertStage> Stage() {
    return std::make_unique<ExpertStage>(config_, *ExpertShardWeights::Load(config_, *ckpt_, {}));
  }
  v1::DispatchRequest RandomRequest(int tokens, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n(0, 1);
    v1::DispatchRequest r;
    r.set_layer(1);
    r.set_num_tokens(tokens);
    r.set_hidden(config_.hidden_size);
    r.set_top_k(2);
    std::vector<float> h(static_cast<size_t>(tokens) * config_.hidden_size);
    for (float& x : h) x = n(rng);
    r.set_hidden_states(std::string(reinterpret_cast<const char*>(h.data()), h.size() * 4));
    for (int i = 0; i < tokens * 2; ++i) {
      r.add_topk_ids(static_cast<int>(rng() % config_.n_routed_experts));
      r.add_topk_weights(n(rng));
    }
    return r;
  }
  // As a transport serves it: the message checked and viewed (the wire
  // decode), run on the service, its output the response.
  static absl::Status Dispatch(ExpertService& s, const v1::DispatchRequest& r,
                               v1::DispatchResponse* response) {
    return ServeDispatch(s, r, response);
  }
  ModelConfig config_;
  std::unique_ptr<Checkpoint> ckpt_;
};

TEST_F(ExpertServiceTest, ConcurrentDispatchesMergeAndEachGetsItsOwnResult) {
  ExpertServiceOptions merging;
  merging.batch_window = std::chrono::milliseconds(200);
  ExpertService merged(Stage(), "fp", merging);
  ExpertServiceOptions solo_opt;
  solo_opt.batch_window = std::chrono::microseconds(0);
  ExpertService solo(Stage(), "fp", solo_opt);

  std::vector<v1::DispatchRequest> reqs = {RandomRequest(3, 1), RandomRequest(5, 2),
                                           RandomRequest(1, 3)};
  std::vector<v1::DispatchResponse> got(reqs.size()), want(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] { ASSERT_TRUE(Dispatch(merged, reqs[i], &got[i]).ok()); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) ASSERT_TRUE(Dispatch(solo, reqs[i], &want[i]).ok());
  EXPECT_EQ(merged.num_dispatches(), 3);
  EXPECT_EQ(merged.num_batches(), 1);  // all three joined the first one's window
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(got[i].output().size(), want[i].output().size());
    std::vector<float> a(got[i].output().size() / 4), b(a.size());
    std::memcpy(a.data(), got[i].output().data(), got[i].output().size());
    std::memcpy(b.data(), want[i].output().data(), want[i].output().size());
    for (size_t j = 0; j < a.size(); ++j) EXPECT_NEAR(a[j], b[j], 1e-5) << "request " << i;
  }
}

// With one attention worker nobody ever joins a batch: after solo_batches of
// them the window is skipped (it would add its length to every MoE layer).
TEST_F(ExpertServiceTest, OneDispatcherStopsWaitingForJoiners) {
  ExpertServiceOptions o;
  o.batch_window = std::chrono::milliseconds(300);
  o.solo_batches = 3;
  ExpertService s(Stage(), "fp", o);
  const v1::DispatchRequest req = RandomRequest(2, 4);
  auto timed = [&] {
    v1::DispatchResponse resp;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_TRUE(Dispatch(s, req, &resp).ok());
    return std::chrono::steady_clock::now() - t0;
  };
  for (int i = 0; i < 3; ++i)
    EXPECT_GE(timed(), std::chrono::milliseconds(300)) << "batch " << i << " did not wait";
  EXPECT_LT(timed(), std::chrono::milliseconds(250)) << "still waiting for joiners that never come";
  EXPECT_EQ(s.num_batches(), 4);
}

TEST_F(ExpertServiceTest, RejectsMalformedDispatch) {
  ExpertService s(Stage(), "fp", {});
  v1::DispatchResponse resp;
  v1::DispatchRequest r = RandomRequest(2, 9);
  r.set_num_tokens(3);  // bytes do not match: the wire decode refuses it
  EXPECT_EQ(DecodeDispatchRequest(r).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Dispatch(s, r, &resp).code(), absl::StatusCode::kInvalidArgument);
  r = RandomRequest(2, 9);
  r.mutable_topk_weights()->RemoveLast();
  EXPECT_EQ(Dispatch(s, r, &resp).code(), absl::StatusCode::kInvalidArgument);
  r = RandomRequest(2, 9);
  r.set_top_k(0);
  EXPECT_EQ(Dispatch(s, r, &resp).code(), absl::StatusCode::kInvalidArgument);
  // Well-formed views the dispatcher refuses.
  r = RandomRequest(2, 9);
  r.set_layer(0);  // dense layer
  absl::StatusOr<DecodedDispatch> d = DecodeDispatchRequest(r);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<float> out(static_cast<size_t>(2) * config_.hidden_size);
  EXPECT_EQ(s.Dispatch(d->dispatch, out.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Dispatch(s, r, &resp).code(), absl::StatusCode::kInvalidArgument);
  r = RandomRequest(2, 9);
  r.set_topk_ids(0, 99);
  EXPECT_EQ(Dispatch(s, r, &resp).code(), absl::StatusCode::kInvalidArgument);
  MoeDispatch bad;  // bad dimensions, without the wire
  bad.layer = 1, bad.num_tokens = 1, bad.hidden = 0, bad.top_k = 2;
  EXPECT_EQ(s.Dispatch(bad, out.data()).code(), absl::StatusCode::kInvalidArgument);
}

// Replicas come and go: LoadExperts adds experts; with `exact` it also
// drops the rest (cold replicas), and a dispatch naming a dropped expert is
// refused rather than computed without it.
TEST_F(ExpertServiceTest, LoadExactlyDropsTheRestAndRefusesTheirPairs) {
  ExpertServiceOptions o;
  o.loader = [this](const std::set<int>& ids) {
    return ExpertShardWeights::Load(config_, *ckpt_, ids);
  };
  ExpertService s(Stage(), "fp", o);
  auto load = [&](std::vector<int> ids, bool exact, std::vector<int>* hosted) {
    v1::LoadExpertsRequest req;
    req.mutable_expert_ids()->Add(ids.begin(), ids.end());
    req.set_exact(exact);
    v1::LoadExpertsResponse resp;
    grpc::ServerContext ctx;
    const grpc::Status st = s.LoadExperts(&ctx, &req, &resp);
    hosted->assign(resp.expert_ids().begin(), resp.expert_ids().end());
    return st;
  };
  std::vector<int> hosted;
  ASSERT_TRUE(load({0, 1, 2, 3}, true, &hosted).ok());
  EXPECT_EQ(hosted, (std::vector<int>{0, 1, 2, 3}));
  // The kept experts compute as before; a pair of a dropped one is refused.
  v1::DispatchRequest r = RandomRequest(3, 5);
  for (int i = 0; i < r.topk_ids_size(); ++i) r.set_topk_ids(i, i % 4);
  v1::DispatchResponse got, want;
  ASSERT_TRUE(Dispatch(s, r, &got).ok());
  ExpertService whole(Stage(), "fp", {});
  ASSERT_TRUE(Dispatch(whole, r, &want).ok());
  EXPECT_EQ(got.output(), want.output());
  r.set_topk_ids(0, 6);
  EXPECT_EQ(Dispatch(s, r, &got).code(), absl::StatusCode::kFailedPrecondition);
  // Loading adds (without exact, nothing is dropped); an empty exact set is refused.
  ASSERT_TRUE(load({6}, false, &hosted).ok());
  EXPECT_EQ(hosted, (std::vector<int>{0, 1, 2, 3, 6}));
  EXPECT_TRUE(Dispatch(s, r, &got).ok());
  EXPECT_EQ(load({}, true, &hosted).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(hosted.size(), 0u);
}

// One handler for both memory kinds: a CPU worker refuses a device-resident
// dispatch (as cuda_ipc or nccl would hand it over) saying what it takes,
// and still serves host ones.
TEST_F(ExpertServiceTest, ACpuWorkerRefusesDeviceMemoryThroughTheOneHandler) {
  ExpertServiceOptions o;
  o.batch_window = std::chrono::microseconds(0);
  ExpertService service(Stage(), "fp", o);
  const v1::DispatchRequest r = RandomRequest(2, 4);
  absl::StatusOr<DecodedDispatch> d = DecodeDispatchRequest(r);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<float> out(static_cast<size_t>(2) * config_.hidden_size);
  MoeDispatch device = d->dispatch;
  device.memory = DispatchMemory::CudaDevice(0);
  const absl::Status s = service.Dispatch(device, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("takes host f32 dispatches, not cuda:0 bf16"), std::string::npos) << s;
  EXPECT_TRUE(service.Dispatch(d->dispatch, out.data()).ok());
}

}  // namespace
}  // namespace moesh
