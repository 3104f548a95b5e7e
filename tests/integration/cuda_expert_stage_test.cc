// CudaExpertStage (an expert worker's shard on the GPU) against the CPU
// ExpertStage on the same shard: pairs of other shards skipped, replicas
// added while serving, bad dispatches refused, V3.2's and V4's experts, and
// callers on different lanes not waiting on each other. Skips (with a
// message) where no GPU is present.
#include "common/cuda_backend/cuda_expert_stage.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "base/dtype.h"
#include "base/status.h"
#include "common/cuda_backend/model_test_util.h"
#include "common/model/expert_client.h"
#include "common/model/weights.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/stream_flag.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::RandomMoeInput;
using testing::RelMaxErr;

const std::string kGoldenV3 = testing::GoldenDir("v3");

using Loaded = testing::CheckedCheckpoint;
using testing::OpenChecked;

TEST(CudaExpertStageTest, MatchesCpuStageOnItsShardAndAfterAddShard) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(kGoldenV3));
  const ModelConfig& c = m.config;
  const std::set<int> shard = {1, 3, 4};
  MOESH_ASSERT_OK_AND_ASSIGN(auto cpu_w, ExpertShardWeights::Load(c, *m.ckpt, shard));
  MOESH_ASSERT_OK_AND_ASSIGN(auto gpu_w, ExpertShardWeights::Load(c, *m.ckpt, shard));
  ExpertStage cpu(c, std::move(cpu_w));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaExpertStage> gpu,
                             CudaExpertStage::Create(c, std::move(gpu_w)));
  EXPECT_EQ(gpu->expert_ids(), shard);
  EXPECT_EQ(gpu->device().rfind("cuda:", 0), 0u);

  const int layer = c.first_k_dense_replace;  // the first MoE layer
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto check = [&](int tokens) {
    const RandomMoeInput in(c, layer, tokens, rng, /*min_id=*/-1);
    const MoeDispatch& d = in.dispatch;
    // Accumulate adds: start both from the same non-zero contents.
    std::vector<float> want(in.x.size()), got(in.x.size());
    for (size_t i = 0; i < want.size(); ++i) want[i] = got[i] = 0.25f * u(rng);
    const std::vector<float> before = want;
    ASSERT_TRUE(cpu.Accumulate(d, want.data()).ok());
    absl::Status s = gpu->Accumulate(d, got.data());
    ASSERT_TRUE(s.ok()) << s;
    double changed = 0;
    for (size_t i = 0; i < want.size(); ++i)
      changed = std::max(changed, std::fabs(double(want[i]) - before[i]));
    ASSERT_GT(changed, 1e-3) << "the shard's experts received no tokens: the test checks nothing";
    const double err = RelMaxErr(got, want);
    EXPECT_LT(err, 2e-2) << tokens << " tokens";  // bf16 weights and activations
  };
  for (int tokens : {1, 5, 37, 300}) check(tokens);

  // Replicas placed while serving: both stages take experts 0 and 6.
  MOESH_ASSERT_OK_AND_ASSIGN(auto more_cpu, ExpertShardWeights::Load(c, *m.ckpt, {0, 6}));
  MOESH_ASSERT_OK_AND_ASSIGN(auto more_gpu, ExpertShardWeights::Load(c, *m.ckpt, {0, 6}));
  MOESH_ASSERT_OK(cpu.AddShard(std::move(more_cpu)));
  MOESH_ASSERT_OK(gpu->AddShard(std::move(more_gpu)));
  EXPECT_EQ(gpu->expert_ids(), (std::set<int>{0, 1, 3, 4, 6}));
  for (int tokens : {3, 64}) check(tokens);
  // Cold replicas dropped (a rebalance moved them): both stages lose 1 and 6.
  MOESH_ASSERT_OK(cpu.RemoveExperts({1, 6}));
  MOESH_ASSERT_OK(gpu->RemoveExperts({1, 6}));
  EXPECT_EQ(gpu->expert_ids(), (std::set<int>{0, 3, 4}));
  for (int tokens : {5, 37}) check(tokens);
  EXPECT_EQ(gpu->RemoveExperts({0, 3, 4}).code(),
            absl::StatusCode::kInvalidArgument);  // none would be left
  EXPECT_EQ(gpu->expert_ids(), (std::set<int>{0, 3, 4}));

  // Bad dispatches: a dense layer, a wrong width, an expert beyond the model.
  std::vector<float> x(c.hidden_size, 0.5f), out(c.hidden_size, 0.0f),
      w(c.num_experts_per_tok, 1.0f);
  std::vector<int32_t> ids(c.num_experts_per_tok, 1);
  MoeDispatch d;
  d.layer = 0, d.num_tokens = 1, d.hidden = c.hidden_size, d.top_k = c.num_experts_per_tok;
  d.hidden_states = x.data(), d.topk_ids = ids.data(), d.topk_weights = w.data();
  EXPECT_EQ(gpu->Accumulate(d, out.data()).code(), absl::StatusCode::kInvalidArgument);
  d.layer = layer;
  d.hidden = c.hidden_size / 2;
  EXPECT_EQ(gpu->Accumulate(d, out.data()).code(), absl::StatusCode::kInvalidArgument);
  d.hidden = c.hidden_size;
  ids[0] = c.n_routed_experts;
  EXPECT_EQ(gpu->Accumulate(d, out.data()).code(), absl::StatusCode::kInvalidArgument);
}

// Lanes (MoeDispatch::lane, a transport's attachment): a device dispatch
// whose `ready` never fires holds up only its own lane. Another lane's
// dispatch completes meanwhile; released, the held one completes with the
// CPU stage's sums. With one stream for every caller the second call would
// wait behind the first forever (so it runs on a thread, bounded).
TEST(CudaExpertStageTest, LanesDoNotWaitOnEachOther) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(kGoldenV3));
  const ModelConfig& c = m.config;
  std::set<int> all;
  for (int e = 0; e < c.n_routed_experts; ++e) all.insert(e);
  MOESH_ASSERT_OK_AND_ASSIGN(auto cpu_w, ExpertShardWeights::Load(c, *m.ckpt, all));
  MOESH_ASSERT_OK_AND_ASSIGN(auto gpu_w, ExpertShardWeights::Load(c, *m.ckpt, all));
  ExpertStage cpu(c, std::move(cpu_w));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaExpertStage> gpu,
                             CudaExpertStage::Create(c, std::move(gpu_w)));
  const int layer = c.first_k_dense_replace, tokens = 6, h = c.hidden_size;
  std::mt19937 rng(11);
  const RandomMoeInput held_in(c, layer, tokens, rng), free_in(c, layer, tokens, rng);

  // Lane 1: a device dispatch whose `ready` waits on a flag nobody writes yet.
  std::vector<uint16_t> x_bf16(held_in.x.size());
  std::vector<float> x_rounded(held_in.x.size());
  for (size_t i = 0; i < x_bf16.size(); ++i) {
    x_bf16[i] = F32ToBf16(held_in.x[i]);
    x_rounded[i] = Bf16ToF32(x_bf16[i]);
  }
  MOESH_ASSERT_OK_AND_ASSIGN(auto x, DeviceBuffer<uint16_t>::Create(x_bf16.size()));
  MOESH_ASSERT_OK_AND_ASSIGN(auto ids, DeviceBuffer<int32_t>::Create(held_in.ids.size()));
  MOESH_ASSERT_OK_AND_ASSIGN(auto w, DeviceBuffer<float>::Create(held_in.w.size()));
  MOESH_ASSERT_OK_AND_ASSIGN(auto out,
                             DeviceBuffer<float>::Create(static_cast<size_t>(tokens) * h));
  MOESH_ASSERT_OK_AND_ASSIGN(auto flag, DeviceBuffer<uint32_t>::Create(1));
  MOESH_ASSERT_OK(x.CopyFrom(x_bf16));
  MOESH_ASSERT_OK(ids.CopyFrom(held_in.ids));
  MOESH_ASSERT_OK(w.CopyFrom(held_in.w));
  MOESH_ASSERT_OK(flag.CopyFrom({0u}));
  MOESH_ASSERT_OK_AND_ASSIGN(Stream blocker, Stream::Create());
  MOESH_ASSERT_OK_AND_ASSIGN(Stream releaser, Stream::Create());
  MOESH_ASSERT_OK_AND_ASSIGN(Event ready, Event::Create());
  MOESH_ASSERT_OK_AND_ASSIGN(Event done, Event::Create());
  MOESH_ASSERT_OK(StreamWaitFlag(blocker.get(), flag.get(), 1));
  MOESH_ASSERT_OK(ready.Record(blocker.get()));
  MoeDispatch held;
  held.layer = layer, held.num_tokens = tokens, held.hidden = h, held.top_k = c.num_experts_per_tok;
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  held.memory = DispatchMemory::CudaDevice(device);
  held.hidden_states = x.get(), held.topk_ids = ids.get(), held.topk_weights = w.get();
  held.ready = ready.get(), held.done = done.get(), held.lane = 1;
  MOESH_ASSERT_OK(gpu->Accumulate(held, out.get()));  // enqueued: returns at once
  EXPECT_EQ(cudaEventQuery(done.get()), cudaErrorNotReady);

  // Lane 0: a host dispatch, waited for on the host.
  std::vector<float> got(free_in.x.size(), 0.0f), want(free_in.x.size(), 0.0f);
  ASSERT_TRUE(cpu.Accumulate(free_in.dispatch, want.data()).ok());
  std::atomic<bool> finished{false};
  absl::Status free_status;
  std::thread other([&] {
    free_status = gpu->Accumulate(free_in.dispatch, got.data());
    finished.store(true);
  });
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!finished.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
  const bool overlapped = finished.load();
  MOESH_ASSERT_OK(StreamWriteFlag(releaser.get(), flag.get(), 1));  // release lane 1 either way
  other.join();
  ASSERT_TRUE(overlapped) << "a dispatch on lane 0 waited for lane 1's unfired `ready`";
  MOESH_ASSERT_OK(free_status);
  EXPECT_LT(RelMaxErr(got, want), 2e-2);

  // Released: lane 1's sums, against the CPU stage on the same bf16 inputs.
  ASSERT_EQ(cudaEventSynchronize(done.get()), cudaSuccess);
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> held_got, out.ToHost());
  std::vector<float> held_want(held_got.size(), 0.0f);
  MoeDispatch host = held_in.dispatch;
  host.hidden_states = x_rounded.data();
  ASSERT_TRUE(cpu.Accumulate(host, held_want.data()).ok());
  EXPECT_LT(RelMaxErr(held_got, held_want), 2e-2);
}

// The expert workers of V3.2 and V4 on the GPU: V3.2's experts are V3's;
// V4's clamp the SwiGLU (swiglu_limit, 0.5 in the golden: most activations
// hit it). Against the CPU stage, which matched transformers (golden_test).
class NewFamiliesExpertStageTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Goldens, NewFamiliesExpertStageTest, ::testing::Values("v32", "v4"));

TEST_P(NewFamiliesExpertStageTest, MatchesCpuStage) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(testing::GoldenDir(GetParam())));
  const ModelConfig& c = m.config;
  MOESH_ASSERT_OK_AND_ASSIGN(auto cpu_w, ExpertShardWeights::Load(c, *m.ckpt, {}));
  MOESH_ASSERT_OK_AND_ASSIGN(auto gpu_w, ExpertShardWeights::Load(c, *m.ckpt, {}));
  ExpertStage cpu(c, std::move(cpu_w));
  ModelConfig unclamped_config = c;
  unclamped_config.swiglu_limit = 0.0;
  MOESH_ASSERT_OK_AND_ASSIGN(auto raw_w, ExpertShardWeights::Load(c, *m.ckpt, {}));
  ExpertStage unclamped(unclamped_config, std::move(raw_w));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<CudaExpertStage> gpu,
                             CudaExpertStage::Create(c, std::move(gpu_w)));
  int layer = 0;
  while (!cpu.IsMoeLayer(layer)) ++layer;
  std::mt19937 rng(11);
  for (int tokens : {1, 7, 64}) {
    // Hidden states large enough that the experts' activations reach the clamp.
    const RandomMoeInput in(c, layer, tokens, rng, /*min_id=*/0, /*x_scale=*/4.0f);
    const MoeDispatch& d = in.dispatch;
    const size_t n = in.x.size();
    std::vector<float> want(n, 0.0f), got(n, 0.0f), raw(n, 0.0f);
    MOESH_ASSERT_OK(cpu.Accumulate(d, want.data()));
    MOESH_ASSERT_OK(unclamped.Accumulate(d, raw.data()));
    MOESH_ASSERT_OK(gpu->Accumulate(d, got.data()));
    EXPECT_LT(RelMaxErr(got, want), 2e-2) << tokens << " tokens";  // bf16 weights and activations
    if (c.swiglu_limit > 0) {
      EXPECT_GT(RelMaxErr(raw, want), 0.1) << "the clamp changed nothing: the test checks nothing";
    }
  }
}

}  // namespace
}  // namespace moesh::cuda
