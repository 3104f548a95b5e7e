// The device checks MakeAttentionBackend / MakeExpertStage make before any
// weights move: `--quantization fp8` is refused by name where it has no
// meaning (an FP8 checkpoint, DeepSeek-V4); DeepSeek-V4 in its
// shipped precision (FP8 linears, MXFP4 experts) runs on both engines (the
// GPU's side: cuda_fp8_model_test).
#include "common/backend/backends.h"

#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

ModelConfig QuantizedV4() {
  absl::StatusOr<ModelConfig> c = PresetConfig("v4", "tiny");
  EXPECT_TRUE(c.ok());
  c->fp8_block_weights = true;
  c->mxfp4_experts = true;
  EXPECT_TRUE(c->Validate("test").ok());
  return *c;
}

TEST(BackendsTest, QuantizationFlagRefusedByNameWhereItHasNoMeaning) {
  absl::StatusOr<ModelConfig> v4 = PresetConfig("v4", "tiny");
  ASSERT_TRUE(v4.ok());
  DeviceOptions o;
  o.device = "cuda";
  o.dummy_weights = true;
  o.fp8_linears = true;
  struct Case {
    ModelConfig config;
    const char* device;
    absl::StatusCode code;
    const char* says;
  };
  for (const Case& c :
       {Case{*v4, "cuda", absl::StatusCode::kUnimplemented, "DeepSeek-V4"},
        Case{QuantizedV4(), "cuda", absl::StatusCode::kInvalidArgument, "FP8 already"}}) {
    o.device = c.device;
    absl::StatusOr<std::unique_ptr<AttentionBackend>> b =
        MakeAttentionBackend(c.config, nullptr, o, /*with_experts=*/true);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), c.code) << b.status();
    EXPECT_NE(b.status().message().find(c.says), std::string::npos) << b.status();
    EXPECT_NE(b.status().message().find("--quantization fp8"), std::string::npos) << b.status();
    absl::StatusOr<std::unique_ptr<ExpertStage>> s = MakeExpertStage(c.config, nullptr, o);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), c.code) << s.status();
  }
}

TEST(BackendsTest, CpuTakesQuantizedV4) {
  absl::StatusOr<std::unique_ptr<ExpertShardWeights>> w =
      ExpertShardWeights::Placeholder(QuantizedV4(), {0, 1});
  ASSERT_TRUE(w.ok());
  DeviceOptions o;  // cpu
  absl::StatusOr<std::unique_ptr<ExpertStage>> s = MakeExpertStage(QuantizedV4(), std::move(*w), o);
  EXPECT_TRUE(s.ok()) << s.status();
}

// The CPU stage computes from float32 weights: a shard left in its checkpoint
// for a GPU to read (Deferred) is refused by name, not computed as zeros.
TEST(BackendsTest, CpuRefusesADeferredShard) {
  absl::StatusOr<ModelConfig> c = PresetConfig("v3", "tiny");
  ASSERT_TRUE(c.ok());
  const std::string dir = ::testing::TempDir() + "/backends_test_deferred";
  ASSERT_TRUE(WriteRandomCheckpoint(*c, dir, {}).ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<std::unique_ptr<ExpertShardWeights>> w =
      ExpertShardWeights::Deferred(*c, **ckpt, {0, 1});
  ASSERT_TRUE(w.ok());
  DeviceOptions o;  // cpu
  absl::StatusOr<std::unique_ptr<ExpertStage>> s = MakeExpertStage(*c, std::move(*w), o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find("Deferred"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace moesh
