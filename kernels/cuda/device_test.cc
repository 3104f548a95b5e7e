// Device discovery and RAII owners; argument checks that need no GPU.
#include "kernels/cuda/device.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/routing.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

TEST(DeviceTest, CountIsNeverAnErrorWithoutADevice) {
  const absl::StatusOr<int> n = CudaDeviceCount();
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_GE(*n, 0);
}

TEST(DeviceTest, BufferStreamEventRoundTrip) {
  MOESH_REQUIRE_GPU();
  std::vector<int32_t> host(1000);
  for (int i = 0; i < 1000; ++i) host[i] = i * 7 - 3;
  MOESH_ASSERT_OK_AND_ASSIGN(DeviceBuffer<int32_t> d, testing::Upload(host));
  EXPECT_EQ(d.size(), 1000u);
  MOESH_ASSERT_OK_AND_ASSIGN(Stream s, Stream::Create());
  MOESH_ASSERT_OK_AND_ASSIGN(Event a, Event::Create());
  MOESH_ASSERT_OK_AND_ASSIGN(Event b, Event::Create());
  MOESH_ASSERT_OK(a.Record(s.get()));
  MOESH_ASSERT_OK(b.Record(s.get()));
  MOESH_ASSERT_OK_AND_ASSIGN(float ms, b.ElapsedMsSince(a));
  EXPECT_GE(ms, 0.0f);
  DeviceBuffer<int32_t> moved = std::move(d);
  EXPECT_EQ(d.get(), nullptr);
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<int32_t> back, moved.ToHost());
  EXPECT_EQ(back, host);
  MOESH_ASSERT_OK_AND_ASSIGN(DeviceInfo info, CurrentDeviceInfo());
  EXPECT_GT(info.num_sms, 0);
}

// Work forked onto a ForkedStream runs after its source stream's earlier
// work, and the stream it joins runs later work after it: the side's fill
// lands between the two fills of the main stream, in every byte.
TEST(DeviceTest, ForkedStreamOrdersBothWays) {
  MOESH_REQUIRE_GPU();
  constexpr size_t kBytes = size_t{64} << 20;
  MOESH_ASSERT_OK_AND_ASSIGN(DeviceBuffer<uint8_t> a, DeviceBuffer<uint8_t>::Create(kBytes));
  MOESH_ASSERT_OK_AND_ASSIGN(DeviceBuffer<uint8_t> b, DeviceBuffer<uint8_t>::Create(kBytes));
  MOESH_ASSERT_OK_AND_ASSIGN(Stream main, Stream::Create());
  MOESH_ASSERT_OK_AND_ASSIGN(ForkedStream side, ForkedStream::Create());
  ASSERT_TRUE(side.created());
  ASSERT_EQ(cudaMemsetAsync(a.get(), 1, kBytes, main.get()), cudaSuccess);
  MOESH_ASSERT_OK(side.Fork(main.get()));
  // a's 1s copied into b, after the fill above; then a refilled by the side.
  ASSERT_EQ(cudaMemcpyAsync(b.get(), a.get(), kBytes, cudaMemcpyDeviceToDevice, side.get()),
            cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(a.get(), 2, kBytes, side.get()), cudaSuccess);
  MOESH_ASSERT_OK(side.Join(main.get()));
  ASSERT_EQ(cudaMemsetAsync(b.get(), 3, kBytes / 2, main.get()), cudaSuccess);
  MOESH_ASSERT_OK(main.Synchronize());
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> ha, a.ToHost());
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> hb, b.ToHost());
  EXPECT_EQ(std::count(ha.begin(), ha.end(), 2), static_cast<std::ptrdiff_t>(kBytes));
  EXPECT_EQ(std::count(hb.begin(), hb.begin() + kBytes / 2, 3),
            static_cast<std::ptrdiff_t>(kBytes / 2));
  EXPECT_EQ(std::count(hb.begin() + kBytes / 2, hb.end(), 1),
            static_cast<std::ptrdiff_t>(kBytes / 2));
}

TEST(DeviceTest, HugeAllocationIsResourceExhausted) {
  MOESH_REQUIRE_GPU();
  auto b = DeviceBuffer<uint8_t>::Create(size_t{1} << 50);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted) << b.status();
}

// Shape checks run before anything touches the device.
TEST(ArgCheckTest, BadShapesAreInvalidArgument) {
  MoeGateParams gate;
  gate.num_tokens = 1;
  gate.num_experts = 64;
  gate.top_k = 0;
  EXPECT_EQ(RunMoeGate(gate).code(), absl::StatusCode::kInvalidArgument);
  gate.top_k = 6;
  gate.select = GateSelect::kGroupMax;
  gate.n_group = 5;  // does not divide 64
  EXPECT_EQ(RunMoeGate(gate).code(), absl::StatusCode::kInvalidArgument);

  RmsNormParams norm;
  norm.rows = 2;
  norm.n = 0;
  EXPECT_EQ(RunRmsNorm(norm).code(), absl::StatusCode::kInvalidArgument);

  RopeParams rope;
  rope.num_tokens = 1;
  rope.rope.dim = 7;
  EXPECT_EQ(RunRope(rope).code(), absl::StatusCode::kInvalidArgument);

  MlaDecodeParams mla;
  mla.kv_lora_rank = 256;
  EXPECT_EQ(RunMlaDecode(mla).code(), absl::StatusCode::kInvalidArgument);
  mla.kv_lora_rank = 512;
  mla.batch = 1;
  mla.num_heads = 16;
  mla.num_blocks = 4;
  mla.max_blocks_per_seq = 2;
  mla.max_seq_len = 129;  // > 2 blocks
  EXPECT_EQ(RunMlaDecode(mla).code(), absl::StatusCode::kInvalidArgument);

  GreedyLogprobsParams lp;
  lp.batch = 1;
  lp.vocab = 100;
  lp.top_k = 21;
  EXPECT_EQ(RunGreedyLogprobs(lp).code(), absl::StatusCode::kInvalidArgument);
}

TEST(PlanTest, SplitsFillTheDevice) {
  // One long sequence: split across the SMs, at most one tile per split... capped.
  MlaDecodePlan p = PlanMlaDecode(1, 16, 8192, 132);
  EXPECT_GT(p.num_splits, 16);
  EXPECT_EQ(p.workspace_bytes, size_t{1} * p.num_splits * 16 * 513 * 4);
  // A batch that fills the device's CTA slots: no split, no workspace.
  p = PlanMlaDecode(128, 16, 8192, 132, MlaTileConfig::kTokens64Stages2);  // one CTA per SM
  EXPECT_EQ(p.num_splits, 1);
  EXPECT_EQ(p.workspace_bytes, 0u);
  p = PlanMlaDecode(128, 16, 8192, 132, MlaTileConfig::kTokens32Stages2);  // two CTAs per SM
  EXPECT_EQ(p.num_splits, 2);
  // Never more splits than tiles.
  p = PlanMlaDecode(1, 16, 100, 132, MlaTileConfig::kTokens64Stages2);
  EXPECT_LE(p.num_splits, 2);
  p = PlanMlaDecode(1, 16, 100, 132, MlaTileConfig::kTokens32Stages2);
  EXPECT_LE(p.num_splits, 4);
  // 128 heads take the 64-head kernel by default: two CTAs per sequence, one
  // per SM, so batch 66 fills 132 SMs without splitting and batch 1 splits.
  p = PlanMlaDecode(66, 128, 8192, 132);
  EXPECT_EQ(p.num_splits, 1);
  EXPECT_EQ(PlanMlaDecode(66, 128, 8192, 132, MlaTileConfig::kHeads64Tokens64Stages2).num_splits,
            1);
  p = PlanMlaDecode(1, 128, 8192, 132);
  EXPECT_GT(p.num_splits, 16);
  EXPECT_EQ(p.workspace_bytes, size_t{1} * p.num_splits * 128 * 513 * 4);
  // ...but not down to one tile a split: the 64-head kernel's partials cost
  // more than a tile's time saved (batch 1 x 4096: 32 splits, not 64).
  EXPECT_EQ(PlanMlaDecode(1, 128, 4096, 132).num_splits, 32);
  // The 16-head kernel's partials too (batch 1 x 2048, bf16 rows: 32 splits
  // ran 11.3 us against 64's 12.7; kernel_bench --mla-table).
  EXPECT_EQ(PlanMlaDecode(1, 16, 2048, 132, MlaTileConfig::kTokens32Stages2).num_splits, 32);
  EXPECT_EQ(
      PlanMlaDecode(1, 128, 4096, 132, MlaTileConfig::kDefault, KvCacheDtype::kFp8).num_splits, 32);
}

}  // namespace
}  // namespace moesh::cuda
