// Loading a checkpoint that disagrees with its config.json fails with an error
// naming the file and the tensor; never a crash or a silently wrong model.
#include "common/model/weights.h"

#include <cstring>
#include <filesystem>
#include <functional>

#include "base/dtype.h"
#include "base/file_util.h"
#include "common/model/model.h"
#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

// A random tiny checkpoint of `family` in `dtype` (F8_E4M3: the linears as
// DeepSeek-V3 ships them), under the test's temporary directory.
std::string FreshTinyCheckpoint(const std::string& name, const std::string& family = "v3",
                                DType dtype = DType::kBF16) {
  const std::string dir = JoinPath(::testing::TempDir(), "weights_test_" + name);
  std::filesystem::remove_all(dir);
  absl::StatusOr<ModelConfig> c = PresetConfig(family, "tiny");
  EXPECT_TRUE(c.ok());
  RandomCheckpointOptions o;
  o.dtype = dtype;
  EXPECT_TRUE(WriteRandomCheckpoint(*c, dir, o).ok());
  return dir;
}

// Rewrites <dir>/model.safetensors through `edit`, which sees every tensor
// and may drop (return false), reshape or retype it, or add more to `w`.
void RewriteTensors(const std::string& dir,
                    const std::function<bool(TensorView&, std::vector<uint8_t>&)>& edit,
                    const std::function<void(SafetensorsWriter&)>& add = nullptr) {
  const std::string path = JoinPath(dir, "model.safetensors");
  SafetensorsWriter w;
  {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> f = SafetensorsFile::Open(path);
    ASSERT_TRUE(f.ok());
    for (const auto& [name, view] : (*f)->tensors()) {
      TensorView v = view;
      std::vector<uint8_t> bytes(view.data, view.data + view.nbytes);
      if (edit(v, bytes)) w.Add(v.name, v.dtype, v.shape, std::move(bytes));
    }
  }
  if (add) add(w);
  ASSERT_TRUE(w.WriteFile(path).ok());
}

TEST(WeightsTest, TinyCheckpointsLoad) {
  for (const char* family : {"v2-lite", "v2", "v3"}) {
    const std::string dir = FreshTinyCheckpoint(std::string("ok_") + family, family);
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir);
    EXPECT_TRUE(m.ok()) << family << ": " << m.status();
  }
}

TEST(WeightsTest, ShardedAndF16AndF32CheckpointsLoadToTheSameModel) {
  absl::StatusOr<ModelConfig> c = PresetConfig("v2", "tiny");
  ASSERT_TRUE(c.ok());
  std::vector<std::vector<float>> logits;
  for (auto [shards, dtype] :
       std::vector<std::pair<int, DType>>{{1, DType::kF32}, {3, DType::kF32}}) {
    const std::string dir =
        JoinPath(::testing::TempDir(), "weights_test_shards" + std::to_string(shards));
    std::filesystem::remove_all(dir);
    RandomCheckpointOptions opt;
    opt.num_shards = shards;
    opt.dtype = dtype;
    ASSERT_TRUE(WriteRandomCheckpoint(*c, dir, opt).ok());
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir);
    ASSERT_TRUE(m.ok()) << m.status();
    SequenceKvCache cache = (*m)->NewCache();
    std::vector<int32_t> prompt = {3, 4, 5};
    SequenceInput in{prompt, &cache};
    absl::StatusOr<std::vector<float>> l = (*m)->Forward(absl::MakeConstSpan(&in, 1));
    ASSERT_TRUE(l.ok());
    logits.push_back(*l);
  }
  EXPECT_EQ(logits[0], logits[1]);
  // F16 of the same seed rounds differently from F32 but is close.
  const std::string dir = JoinPath(::testing::TempDir(), "weights_test_f16");
  std::filesystem::remove_all(dir);
  RandomCheckpointOptions opt;
  opt.dtype = DType::kF16;
  ASSERT_TRUE(WriteRandomCheckpoint(*c, dir, opt).ok());
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status();
}

struct BadCheckpoint {
  const char* name;
  std::function<void(const std::string& dir)> corrupt;
  absl::StatusCode code;
  std::vector<const char*> message_parts;
};

class BadCheckpointTest : public ::testing::TestWithParam<BadCheckpoint> {};

TEST_P(BadCheckpointTest, ClearError) {
  const std::string dir = FreshTinyCheckpoint(GetParam().name);
  GetParam().corrupt(dir);
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), GetParam().code) << m.status();
  for (const char* part : GetParam().message_parts) {
    EXPECT_NE(m.status().message().find(part), std::string::npos)
        << "missing \"" << part << "\" in: " << m.status();
  }
}

const char kKvB[] = "model.layers.1.self_attn.kv_b_proj.weight";

// Rewrites kv_b_proj [128, 32] in `dir` as the e4m3 `codes` (128 * 32 of them)
// with one F32 weight_scale_inv block of `scale` (one 128 x 128 block covers it).
void StoreKvBAsFp8(const std::string& dir, const std::vector<uint8_t>& codes, float scale) {
  RewriteTensors(
      dir,
      [&](TensorView& v, std::vector<uint8_t>& b) {
        if (v.name == kKvB) {
          v.dtype = DType::kF8E4M3;
          b = codes;
        }
        return true;
      },
      [&](SafetensorsWriter& w) {
        std::vector<uint8_t> s(4);
        std::memcpy(s.data(), &scale, 4);
        w.Add(std::string(kKvB) + "_scale_inv", DType::kF32, {1, 1}, s);
      });
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BadCheckpointTest,
    ::testing::Values(
        BadCheckpoint{"missing_tensor",
                      [](const std::string& dir) {
                        RewriteTensors(dir, [](TensorView& v, auto&) { return v.name != kKvB; });
                      },
                      absl::StatusCode::kInvalidArgument,
                      {kKvB, "missing"}},
        BadCheckpoint{"missing_expert",
                      [](const std::string& dir) {
                        RewriteTensors(dir, [](TensorView& v, auto&) {
                          return v.name != "model.layers.2.mlp.experts.7.down_proj.weight";
                        });
                      },
                      absl::StatusCode::kInvalidArgument,
                      {"model.layers.2.mlp.experts.7.down_proj.weight"}},
        BadCheckpoint{"extra_tensor",
                      [](const std::string& dir) {
                        RewriteTensors(
                            dir, [](TensorView&, auto&) { return true; },
                            [](SafetensorsWriter& w) {
                              w.Add("model.layers.0.self_attn.mystery.weight", DType::kF32, {1},
                                    {0, 0, 0, 0});
                            });
                      },
                      absl::StatusCode::kInvalidArgument,
                      {"mystery", "model.safetensors"}},
        BadCheckpoint{"wrong_shape",
                      [](const std::string& dir) {
                        RewriteTensors(dir, [](TensorView& v, std::vector<uint8_t>&) {
                          if (v.name == kKvB) std::swap(v.shape[0], v.shape[1]);
                          return true;
                        });
                      },
                      absl::StatusCode::kInvalidArgument,
                      {kKvB, "[32, 128]", "[128, 32]", "model.safetensors"}},
        BadCheckpoint{"integer_dtype",
                      [](const std::string& dir) {
                        RewriteTensors(dir, [](TensorView& v, std::vector<uint8_t>& b) {
                          if (v.name == "model.norm.weight") {
                            v.dtype = DType::kI32;
                            b.resize(b.size() * 2);
                          }
                          return true;
                        });
                      },
                      absl::StatusCode::kInvalidArgument,
                      {"model.norm.weight", "I32"}},
        BadCheckpoint{"fp8_without_scale",
                      [](const std::string& dir) {
                        RewriteTensors(dir, [](TensorView& v, std::vector<uint8_t>& b) {
                          if (v.name == kKvB) {
                            v.dtype = DType::kF8E4M3;
                            b.resize(b.size() / 2);
                          }
                          return true;
                        });
                      },
                      absl::StatusCode::kInvalidArgument,
                      {kKvB, "weight_scale_inv"}},
        BadCheckpoint{"fp8_nan_code",
                      [](const std::string& dir) {
                        std::vector<uint8_t> codes(128 * 32, 0x38);  // 1.0, one NaN (0xFF)
                        codes[70 * 32 + 5] = 0xFF;
                        StoreKvBAsFp8(dir, codes, 1.0f);
                      },
                      absl::StatusCode::kInvalidArgument,
                      {kKvB, "NaN code at [70, 5]"}},
        BadCheckpoint{"missing_bias_for_noaux_tc",
                      [](const std::string& dir) {
                        RewriteTensors(dir, [](TensorView& v, auto&) {
                          return v.name != "model.layers.1.mlp.gate.e_score_correction_bias";
                        });
                      },
                      absl::StatusCode::kInvalidArgument,
                      {"e_score_correction_bias"}},
        BadCheckpoint{"truncated_file",
                      [](const std::string& dir) {
                        const std::string p = JoinPath(dir, "model.safetensors");
                        std::filesystem::resize_file(p, std::filesystem::file_size(p) - 100);
                      },
                      absl::StatusCode::kDataLoss,
                      {"model.safetensors", "truncated"}},
        BadCheckpoint{"config_contradiction",
                      [](const std::string& dir) {
                        // More layers than the weights hold.
                        std::string c = *ReadFileToString(JoinPath(dir, "config.json"));
                        c.replace(c.find("\"num_hidden_layers\": 3"), 22,
                                  "\"num_hidden_layers\": 4");
                        ASSERT_TRUE(WriteStringToFile(JoinPath(dir, "config.json"), c).ok());
                      },
                      absl::StatusCode::kInvalidArgument,
                      {"model.layers.3."}},
        BadCheckpoint{
            "no_config",
            [](const std::string& dir) { std::filesystem::remove(JoinPath(dir, "config.json")); },
            absl::StatusCode::kNotFound,
            {"config.json"}}),
    [](const ::testing::TestParamInfo<BadCheckpoint>& info) {
      return std::string(info.param.name);
    });

// mkmodel --dtype FP8: the linears as DeepSeek-V3 ships them (e4m3 codes,
// a weight_scale_inv per 128 x 128 block), the rest bf16; the loader reads
// them back as codes x scales.
TEST(WeightsTest, Fp8RandomCheckpointLoads) {
  const std::string dir = FreshTinyCheckpoint("fp8_random", "v3", DType::kF8E4M3);
  absl::StatusOr<ModelConfig> loaded = ModelConfig::Load(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_TRUE(loaded->fp8_block_weights);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  ASSERT_TRUE(ValidateCheckpoint(*loaded, **ckpt).ok()) << ValidateCheckpoint(*loaded, **ckpt);
  int fp8 = 0;
  for (const auto& [name, t] : (*ckpt)->tensors()) {
    if (t->dtype != DType::kF8E4M3) continue;
    ++fp8;
    EXPECT_TRUE(IsFp8Linear(name)) << name;
    ASSERT_TRUE((*ckpt)->tensors().count(name + "_scale_inv")) << name;
  }
  EXPECT_GT(fp8, 0);
  const std::string o_proj = "model.layers.0.self_attn.o_proj.weight";
  const TensorView* codes = (*ckpt)->tensors().at(o_proj);
  ASSERT_EQ(codes->dtype, DType::kF8E4M3);
  absl::StatusOr<std::vector<float>> w =
      ReadTensorF32(**ckpt, o_proj, {codes->shape[0], codes->shape[1]});
  ASSERT_TRUE(w.ok()) << w.status();
  const float scale =
      *reinterpret_cast<const float*>((*ckpt)->tensors().at(o_proj + "_scale_inv")->data);
  EXPECT_EQ((*w)[0], F8E4M3ToF32(codes->data[0]) * scale);
  EXPECT_TRUE(AttentionWeights::Load(*loaded, **ckpt).ok());
}

TEST(WeightsTest, Fp8BlockScalesDequantise) {
  const std::string dir = FreshTinyCheckpoint("fp8");
  // Store kv_b_proj [128, 32] as e4m3 1.0 (0x38) with per-block scales: one row
  // block (128 rows) x one column block; scale 0.5 -> every weight 0.5.
  StoreKvBAsFp8(dir, std::vector<uint8_t>(128 * 32, 0x38), 0.5f);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  absl::StatusOr<ModelConfig> c = ModelConfig::Load(dir);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(ValidateCheckpoint(*c, **ckpt).ok()) << ValidateCheckpoint(*c, **ckpt);
  absl::StatusOr<std::vector<float>> w = ReadTensorF32(**ckpt, kKvB, {128, 32});
  ASSERT_TRUE(w.ok());
  for (float x : *w) ASSERT_EQ(x, 0.5f);
}

// ReadStoredExpert keeps an FP8 checkpoint's codes as views of the file and
// its block scales as float32 (what a device copies as they are); dequantized
// (StoredToValues) they are ReadTensorF32's values exactly. A bf16 checkpoint's
// experts come back as float32 values.
TEST(WeightsTest, StoredExpertsKeepFp8CodesAndDequantiseLikeTheLoader) {
  const std::string dir = FreshTinyCheckpoint("fp8_stored", "v3", DType::kF8E4M3);
  absl::StatusOr<ModelConfig> loaded = ModelConfig::Load(dir);
  ASSERT_TRUE(loaded.ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  const int layer = loaded->first_k_dense_replace, expert = 1;
  absl::StatusOr<StoredMlp> m = ReadStoredExpert(*loaded, **ckpt, layer, expert);
  ASSERT_TRUE(m.ok()) << m.status();
  const std::string prefix = ExpertPrefix(*loaded, layer, expert);
  for (auto [stored, name] : {std::pair<StoredLinear*, const char*>{&m->gate, "gate_proj.weight"},
                              {&m->up, "up_proj.weight"},
                              {&m->down, "down_proj.weight"}}) {
    SCOPED_TRACE(name);
    const TensorView* file = (*ckpt)->tensors().at(prefix + name);
    ASSERT_TRUE(stored->fp8());
    EXPECT_EQ(stored->codes->data, file->data) << "a view into the mapping, not a copy";
    EXPECT_TRUE(stored->values.empty());
    const TensorView* scale = (*ckpt)->tensors().at(prefix + name + "_scale_inv");
    ASSERT_EQ(stored->scale.size(), static_cast<size_t>(scale->numel()));
    std::vector<float> want_scale(scale->numel());
    ConvertToF32(scale->dtype, scale->data, want_scale.size(), want_scale.data());
    EXPECT_EQ(stored->scale, want_scale);
    absl::StatusOr<std::vector<float>> want = ReadTensorF32(**ckpt, prefix + name, file->shape);
    ASSERT_TRUE(want.ok());
    StoredToValues(**ckpt, stored);
    EXPECT_FALSE(stored->fp8());
    EXPECT_EQ(stored->values, *want);
  }
  const std::string bf16_dir = FreshTinyCheckpoint("stored_bf16");
  absl::StatusOr<ModelConfig> bc = ModelConfig::Load(bf16_dir);
  absl::StatusOr<std::unique_ptr<Checkpoint>> bckpt = Checkpoint::Open(bf16_dir);
  ASSERT_TRUE(bc.ok() && bckpt.ok());
  absl::StatusOr<StoredMlp> bm = ReadStoredExpert(*bc, **bckpt, layer, expert);
  ASSERT_TRUE(bm.ok()) << bm.status();
  EXPECT_FALSE(bm->down.fp8());
  EXPECT_EQ(bm->down.values.size(),
            static_cast<size_t>(bc->hidden_size) * bc->moe_intermediate_size);
}

// LoadAttentionLayer with `stored` leaves an FP8 checkpoint's layer linears as
// stored (their float32 vectors empty); dequantized they are Load's values.
TEST(WeightsTest, StoredLayerLinearsAreTheLoadersValuesDequantised) {
  const std::string dir = FreshTinyCheckpoint("fp8_layer", "v3", DType::kF8E4M3);
  absl::StatusOr<ModelConfig> loaded = ModelConfig::Load(dir);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(loaded.ok() && ckpt.ok());
  absl::StatusOr<std::unique_ptr<AttentionWeights>> whole = AttentionWeights::Load(*loaded, **ckpt);
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (int l : {0, loaded->num_hidden_layers - 1}) {  // a dense and a MoE layer (shared experts)
    SCOPED_TRACE(l);
    AttentionLayerWeights lw;
    StoredLayerLinears stored;
    ASSERT_TRUE(LoadAttentionLayer(*loaded, **ckpt, l, &lw, &stored).ok());
    const AttentionLayerWeights& want = (*whole)->layers[l];
    ASSERT_TRUE(stored.q.fp8() && stored.q_b.fp8() && stored.kv_a.fp8() && stored.o_proj.fp8());
    EXPECT_TRUE(lw.q_a_proj.empty() && lw.q_b_proj.empty() && lw.kv_a_proj.empty() &&
                lw.o_proj.empty());
    EXPECT_EQ(lw.kv_b_proj, want.kv_b_proj) << "kv_b_proj is read as float32 (split on the host)";
    for (auto [s, v] :
         {std::pair<StoredLinear*, const std::vector<float>*>{&stored.q, &want.q_a_proj},
          {&stored.q_b, &want.q_b_proj},
          {&stored.kv_a, &want.kv_a_proj},
          {&stored.o_proj, &want.o_proj}}) {
      StoredToValues(**ckpt, s);
      EXPECT_EQ(s->values, *v);
    }
    ASSERT_TRUE(stored.mlp.gate.fp8() && stored.mlp.up.fp8() && stored.mlp.down.fp8());
    const MlpWeights& m = want.is_moe ? want.shared_experts : want.dense_mlp;
    EXPECT_TRUE((want.is_moe ? lw.shared_experts : lw.dense_mlp).gate_up.empty());
    StoredToValues(**ckpt, &stored.mlp.down);
    EXPECT_EQ(stored.mlp.down.values, m.down);
  }
}

// A Deferred shard names its experts and reads nothing: the device stage reads
// them from the checkpoint later. It is not a placeholder (no random values).
TEST(WeightsTest, DeferredShardReadsNothing) {
  const std::string dir = FreshTinyCheckpoint("deferred");
  absl::StatusOr<ModelConfig> c = ModelConfig::Load(dir);
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(c.ok() && ckpt.ok());
  absl::StatusOr<std::unique_ptr<ExpertShardWeights>> w =
      ExpertShardWeights::Deferred(*c, **ckpt, {0, 3});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ((*w)->deferred, ckpt->get());
  EXPECT_FALSE((*w)->is_placeholder());
  EXPECT_EQ((*w)->expert_ids, (std::set<int>{0, 3}));
  EXPECT_TRUE((*ckpt)->tensors_read().empty());
  EXPECT_FALSE(ExpertShardWeights::Deferred(*c, **ckpt, {c->n_routed_experts}).ok());
}

}  // namespace
}  // namespace moesh
