// DeepSeek-V4 checkpoints as V4-Flash ships them (mkmodel --dtype FP8 for
// v4): FP8 linears with ue8m0 `.scale` blocks, routed experts in MXFP4 (I8
// e2m1 pairs + F8_E8M0 `.scale` per 32 inputs), the rest bf16. The CPU engine
// dequantizes them exactly: it computes the same logits as on a float32
// checkpoint of the dequantized weights. Malformed variants are refused with
// the tensor named.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/file_util.h"
#include "common/model/model.h"
#include "common/model/model_test_util.h"
#include "common/model/random_checkpoint.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "gtest/gtest.h"
#include "kernels/cpu/mxfp4.h"

namespace moesh {
namespace {

const char kExpert[] = "model.layers.2.ffn.experts.5.w1.weight";
const char kExpertScale[] = "model.layers.2.ffn.experts.5.w1.scale";

std::string QuantizedV4(const std::string& name) {
  const std::string dir = JoinPath(::testing::TempDir(), "mxfp4_test_" + name);
  std::filesystem::remove_all(dir);
  absl::StatusOr<ModelConfig> c = PresetConfig("v4", "tiny");
  EXPECT_TRUE(c.ok());
  RandomCheckpointOptions o;
  o.dtype = DType::kF8E4M3;
  o.seed = 3;
  EXPECT_TRUE(WriteRandomCheckpoint(*c, dir, o).ok());
  return dir;
}

// Rewrites <dir>/model.safetensors, letting `edit` change (or drop: false)
// each tensor.
void Rewrite(const std::string& dir,
             const std::function<bool(TensorView&, std::vector<uint8_t>&)>& edit) {
  const std::string path = JoinPath(dir, "model.safetensors");
  SafetensorsWriter w;
  {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    for (const auto& [name, view] : (*f)->tensors()) {
      TensorView v = view;
      std::vector<uint8_t> bytes(view.data, view.data + view.nbytes);
      if (edit(v, bytes)) w.Add(v.name, v.dtype, v.shape, std::move(bytes));
    }
  }
  ASSERT_TRUE(w.WriteFile(path).ok());
}

absl::Status LoadStatus(const std::string& dir) { return Model::Load(dir).status(); }

TEST(Mxfp4CheckpointTest, MkmodelWritesV4FlashLayout) {
  const std::string dir = QuantizedV4("layout");
  absl::StatusOr<ModelConfig> c = ModelConfig::Load(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->fp8_block_weights);
  EXPECT_TRUE(c->mxfp4_experts);
  const std::string json = *ReadFileToString(JoinPath(dir, "config.json"));
  EXPECT_NE(json.find("\"scale_fmt\": \"ue8m0\""), std::string::npos);
  EXPECT_NE(json.find("\"expert_dtype\": \"fp4\""), std::string::npos);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  ASSERT_TRUE(ValidateCheckpoint(*c, **ckpt).ok()) << ValidateCheckpoint(*c, **ckpt);
  const auto& t = (*ckpt)->tensors();
  // w1 [moe_inter 32, hidden 64]: I8 [32, 32] + F8_E8M0 [32, 2].
  ASSERT_TRUE(t.count(kExpert) && t.count(kExpertScale));
  EXPECT_EQ(t.at(kExpert)->dtype, DType::kI8);
  EXPECT_EQ(t.at(kExpert)->shape, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(t.at(kExpertScale)->dtype, DType::kF8E8M0);
  EXPECT_EQ(t.at(kExpertScale)->shape, (std::vector<int64_t>{32, 2}));
  // An FP8 linear with a ue8m0 block scale; the compressors stay bf16.
  EXPECT_EQ(t.at("model.layers.1.attn.wq_a.weight")->dtype, DType::kF8E4M3);
  EXPECT_EQ(t.at("model.layers.1.attn.wq_a.scale")->dtype, DType::kF8E8M0);
  EXPECT_EQ(t.at("model.layers.1.attn.compressor.wkv.weight")->dtype, DType::kBF16);
  EXPECT_EQ(t.at("model.layers.1.ffn.shared_experts.w2.weight")->dtype, DType::kF8E4M3);
  // The loader's values: e2m1(nibble) * 2^(scale - 127), low nibble first.
  absl::StatusOr<std::vector<float>> w = ReadTensorF32(**ckpt, kExpert, {32, 64});
  ASSERT_TRUE(w.ok()) << w.status();
  const uint8_t byte = t.at(kExpert)->data[0];
  const float scale = E8M0ToF32(t.at(kExpertScale)->data[0]);
  EXPECT_EQ((*w)[0], cpu::E2M1ToF32(byte & 0xF) * scale);
  EXPECT_EQ((*w)[1], cpu::E2M1ToF32(byte >> 4) * scale);
}

TEST(Mxfp4CheckpointTest, CpuEngineComputesAsOnTheDequantizedWeights) {
  const std::string dir = QuantizedV4("fidelity");
  // The same weights dequantized, as a float32 checkpoint.
  const std::string f32_dir = JoinPath(::testing::TempDir(), "mxfp4_test_fidelity_f32");
  std::filesystem::remove_all(f32_dir);
  absl::StatusOr<ModelConfig> c = ModelConfig::Load(dir);
  ASSERT_TRUE(c.ok());
  {
    absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
    ASSERT_TRUE(ckpt.ok());
    SafetensorsWriter w;
    for (const TensorSpec& spec : CheckpointSchema(*c)) {
      if (spec.integer) {
        absl::StatusOr<std::vector<int32_t>> v = ReadTensorI32(**ckpt, spec.name, spec.shape);
        ASSERT_TRUE(v.ok());
        std::vector<uint8_t> b(v->size() * 4);
        std::memcpy(b.data(), v->data(), b.size());
        w.Add(spec.name, DType::kI32, spec.shape, std::move(b));
        continue;
      }
      absl::StatusOr<std::vector<float>> v = ReadTensorF32(**ckpt, spec.name, spec.shape);
      ASSERT_TRUE(v.ok()) << v.status();
      std::vector<uint8_t> b(v->size() * 4);
      std::memcpy(b.data(), v->data(), b.size());
      w.Add(spec.name, DType::kF32, spec.shape, std::move(b));
    }
    ModelConfig plain = *c;
    plain.fp8_block_weights = false;
    plain.mxfp4_experts = false;
    ASSERT_TRUE(MakeDirs(f32_dir).ok());
    ASSERT_TRUE(WriteStringToFile(JoinPath(f32_dir, "config.json"), plain.ToJson()).ok());
    ASSERT_TRUE(w.WriteCheckpoint(f32_dir, 1).ok());
  }
  absl::StatusOr<std::unique_ptr<Model>> quantized = Model::Load(dir);
  absl::StatusOr<std::unique_ptr<Model>> reference = Model::Load(f32_dir);
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  ASSERT_TRUE(reference.ok()) << reference.status();
  const std::vector<int32_t> tokens = testing_util::RandomTokens(24, c->vocab_size, 9);
  std::vector<std::vector<float>> logits;
  for (Model* m : {quantized->get(), reference->get()}) {
    SequenceKvCache cache = m->NewCache();
    SequenceInput in{tokens, &cache};
    absl::StatusOr<std::vector<float>> l =
        m->Forward(absl::MakeConstSpan(&in, 1), LogitsFor::kAllTokens);
    ASSERT_TRUE(l.ok()) << l.status();
    logits.push_back(*l);
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  EXPECT_EQ(testing_util::MaxAbsDiff(logits[0].data(), logits[1].data(), logits[0].size()), 0.0f);
  float spread = 0;
  for (float x : logits[0]) spread = std::max(spread, std::fabs(x));
  EXPECT_GT(spread, 0.0f);  // a model that computes something
}

struct Malformed {
  const char* name;
  std::function<bool(TensorView&, std::vector<uint8_t>&)> edit;
  std::vector<std::string> message_parts;
};

class MalformedMxfp4Test : public ::testing::TestWithParam<Malformed> {};

TEST_P(MalformedMxfp4Test, RefusedNamingTheTensor) {
  const std::string dir = QuantizedV4(std::string("bad_") + GetParam().name);
  Rewrite(dir, GetParam().edit);
  const absl::Status s = LoadStatus(dir);
  ASSERT_FALSE(s.ok());
  for (const std::string& part : GetParam().message_parts) {
    EXPECT_NE(s.message().find(part), std::string::npos) << "missing \"" << part << "\": " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MalformedMxfp4Test,
    ::testing::Values(
        Malformed{"scale_shape",
                  [](TensorView& v, std::vector<uint8_t>& b) {
                    if (v.name == kExpertScale) {
                      v.shape = {64, 1};  // [32, 2] transposed-ish: same bytes, wrong shape
                    }
                    return true;
                  },
                  {kExpert, kExpertScale, "[32, 2]", "[64, 1]"}},
        Malformed{"scale_dtype",
                  [](TensorView& v, std::vector<uint8_t>& b) {
                    if (v.name == kExpertScale) {
                      v.dtype = DType::kBF16;
                      b.resize(b.size() * 2);
                    }
                    return true;
                  },
                  {kExpert, kExpertScale, "BF16"}},
        Malformed{"missing_scale",
                  [](TensorView& v, std::vector<uint8_t>&) { return v.name != kExpertScale; },
                  {kExpert, kExpertScale}},
        Malformed{"packed_shape",
                  [](TensorView& v, std::vector<uint8_t>&) {
                    if (v.name == kExpert) v.shape = {16, 64};
                    return true;
                  },
                  {kExpert, "[16, 64]", "[32, 32]"}},
        Malformed{"expert_not_fp4",
                  [](TensorView& v, std::vector<uint8_t>& b) {
                    if (v.name == kExpertScale) return false;
                    if (v.name == kExpert) {
                      v.dtype = DType::kBF16;
                      v.shape = {32, 64};
                      b.assign(32 * 64 * 2, 0);
                    }
                    return true;
                  },
                  {kExpert, "expert_dtype fp4"}},
        Malformed{"fp8_scale_shape",
                  [](TensorView& v, std::vector<uint8_t>&) {
                    if (v.name == "model.layers.1.attn.wq_a.scale") v.shape = {1, 1, 1};
                    return true;
                  },
                  {"model.layers.1.attn.wq_a.weight", "[1, 1]"}}),
    [](const ::testing::TestParamInfo<Malformed>& info) { return std::string(info.param.name); });

TEST(Mxfp4CheckpointTest, UnknownDtypeIsRefusedNamingTheTensor) {
  const std::string dir = QuantizedV4("f4_dtype");
  // Spell the expert's dtype "F4" in the header: this build reads I8/U8 pairs.
  const std::string path = JoinPath(dir, "model.safetensors");
  std::string bytes = *ReadFileToString(path);
  const size_t name_at = bytes.find(std::string("\"") + kExpert + "\"");
  ASSERT_NE(name_at, std::string::npos);
  const size_t at = bytes.find("\"dtype\":\"I8\"", name_at);
  ASSERT_NE(at, std::string::npos);
  bytes.replace(at + 9, 2, "F4");
  ASSERT_TRUE(WriteStringToFile(path, bytes).ok());
  const absl::Status s = LoadStatus(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(kExpert), std::string::npos) << s;
  EXPECT_NE(s.message().find("F4"), std::string::npos) << s;
}

TEST(Mxfp4CheckpointTest, ConfigRefusesUnknownExpertDtype) {
  const std::string dir = QuantizedV4("expert_dtype");
  std::string json = *ReadFileToString(JoinPath(dir, "config.json"));
  json.replace(json.find("\"expert_dtype\": \"fp4\""), 21, "\"expert_dtype\": \"nf4\"");
  ASSERT_TRUE(WriteStringToFile(JoinPath(dir, "config.json"), json).ok());
  absl::StatusOr<ModelConfig> c = ModelConfig::Load(dir);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("nf4"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace moesh
