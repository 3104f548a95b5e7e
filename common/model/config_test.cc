#include "common/model/config.h"

#include <cmath>
#include <functional>
#include <string>
#include <utility>

#include "base/file_util.h"
#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moesh {
namespace {

using Json = nlohmann::json;

// DeepSeek-V2-Lite's config.json fields, as DeepSeek ships them (legacy rope form).
Json V2LiteJson() {
  return Json::parse(R"({
    "model_type": "deepseek_v2", "vocab_size": 102400, "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "max_position_embeddings": 163840,
    "q_lora_rank": null, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
    "n_group": 1, "topk_group": 1, "topk_method": "greedy", "scoring_func": "softmax",
    "norm_topk_prob": false, "routed_scaling_factor": 1.0, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "rms_norm_eps": 1e-06, "bos_token_id": 100000, "eos_token_id": 100001,
    "tie_word_embeddings": false, "hidden_act": "silu", "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}
  })");
}

absl::StatusOr<ModelConfig> Parse(const Json& j) {
  return ModelConfig::FromJson(j.dump(), "config.json");
}

TEST(ConfigTest, ParsesV2LiteLegacyForm) {
  absl::StatusOr<ModelConfig> c = Parse(V2LiteJson());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kDeepseekV2);
  EXPECT_EQ(c->q_lora_rank, 0);
  EXPECT_EQ(c->topk_method, TopkMethod::kGreedy);
  EXPECT_EQ(c->rope.type, RopeType::kYarn);
  EXPECT_EQ(c->rope.factor, 40);
  EXPECT_EQ(c->rope.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(c->rope.mscale_all_dim, 0.707);
  EXPECT_EQ(c->eos_token_ids, std::vector<int>{100001});
  EXPECT_TRUE(c->rope_interleave);
  EXPECT_FALSE(c->IsMoeLayer(0));
  EXPECT_TRUE(c->IsMoeLayer(1));
  // qk_head_dim^-0.5 * (0.1 * 0.707 * ln 40 + 1)^2
  const double m = 0.1 * 0.707 * std::log(40.0) + 1.0;
  EXPECT_NEAR(c->SoftmaxScale(), m * m / std::sqrt(192.0), 1e-12);
}

// DeepSeek-V3.2-Exp's config.json fields (the indexer's on top of V3's).
Json V32Json() {
  Json j = V2LiteJson();
  j["model_type"] = "deepseek_v32";
  j["q_lora_rank"] = 1536;
  j["n_routed_experts"] = 256;
  j["num_experts_per_tok"] = 8;
  j["n_group"] = 8;
  j["topk_group"] = 4;
  j["topk_method"] = "noaux_tc";
  j["scoring_func"] = "sigmoid";
  j["index_topk"] = 2048;
  j["index_head_dim"] = 128;
  j["index_n_heads"] = 64;
  j["first_k_dense_replace"] = 3;
  return j;
}

TEST(ConfigTest, ParsesV32Indexer) {
  absl::StatusOr<ModelConfig> c = Parse(V32Json());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->family, ModelFamily::kDeepseekV32);
  EXPECT_TRUE(c->has_indexer());
  EXPECT_EQ(c->indexer.topk, 2048);
  EXPECT_EQ(c->indexer.head_dim, 128);
  EXPECT_EQ(c->indexer.n_heads, 64);
  EXPECT_EQ(c->kv_cache_row_width(), 512 + 64 + 128);
  EXPECT_TRUE(c->rope_interleave);
  // transformers' per-layer spelling must agree with first_k_dense_replace.
  Json j = V32Json();
  j["mlp_layer_types"] = Json::array();
  for (int l = 0; l < 27; ++l) j["mlp_layer_types"].push_back(l < 3 ? "dense" : "sparse");
  EXPECT_TRUE(Parse(j).ok());
  j["mlp_layer_types"][3] = "dense";
  EXPECT_EQ(Parse(j).status().code(), absl::StatusCode::kInvalidArgument);
  // The round trip keeps the indexer.
  absl::StatusOr<ModelConfig> again = ModelConfig::FromJson(c->ToJson(), "again");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->indexer.topk, 2048);
  EXPECT_EQ(again->family, ModelFamily::kDeepseekV32);
}

TEST(ConfigTest, RejectsIncompleteV32) {
  for (const char* key : {"index_topk", "index_head_dim", "index_n_heads"}) {
    Json j = V32Json();
    j.erase(key);
    EXPECT_EQ(Parse(j).status().code(), absl::StatusCode::kInvalidArgument) << key;
  }
  Json j = V32Json();
  j["q_lora_rank"] = nullptr;
  EXPECT_EQ(Parse(j).status().code(), absl::StatusCode::kInvalidArgument);
  j = V32Json();
  j["index_head_dim"] = 32;  // below qk_rope_head_dim
  EXPECT_EQ(Parse(j).status().code(), absl::StatusCode::kInvalidArgument);
}

// transformers' spelling (v4) and DeepSeek's own (v4_legacy), as the golden
// checkpoints carry them.
TEST(ConfigTest, ParsesV4BothForms) {
  const std::string golden = std::string(MOESH_SOURCE_DIR) + "/tests/golden/";
  absl::StatusOr<ModelConfig> modern = ModelConfig::Load(golden + "v4");
  ASSERT_TRUE(modern.ok()) << modern.status();
  EXPECT_TRUE(modern->layers() == LayerArch::kV4);
  EXPECT_EQ(modern->v4.layer_types,
            (std::vector<V4AttentionType>{
                V4AttentionType::kSliding, V4AttentionType::kCompressedSparse,
                V4AttentionType::kHeavilyCompressed, V4AttentionType::kCompressedSparse}));
  EXPECT_EQ(modern->v4.hash_layers, (std::vector<bool>{true, true, false, false}));
  EXPECT_EQ(modern->v4.compress_rate_hca, 8);
  EXPECT_EQ(modern->qk_rope_head_dim, 8);
  EXPECT_EQ(modern->scoring_func, ScoringFunc::kSqrtSoftplus);
  EXPECT_EQ(modern->v4.compress_rope.type, RopeType::kYarn);
  EXPECT_EQ(modern->v4.compress_rope.theta, 160000.0);
  EXPECT_EQ(modern->v4.compress_rope.attention_factor, 1.0);
  EXPECT_EQ(modern->rope.type, RopeType::kDefault);
  EXPECT_EQ(modern->kv_cache_row_width(), 5 * 32 + 4 * 16);

  absl::StatusOr<ModelConfig> legacy = ModelConfig::Load(golden + "v4_legacy");
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  EXPECT_EQ(legacy->v4.layer_types,
            (std::vector<V4AttentionType>{V4AttentionType::kHeavilyCompressed,
                                          V4AttentionType::kCompressedSparse,
                                          V4AttentionType::kSliding}));
  EXPECT_EQ(legacy->v4.hash_layers, (std::vector<bool>{true, false, false}));
  EXPECT_EQ(legacy->v4.compress_rate_hca, 128);
  EXPECT_EQ(legacy->qk_rope_head_dim, 8);
  EXPECT_EQ(legacy->v4.compress_rope.type, RopeType::kYarn);
  EXPECT_EQ(legacy->v4.compress_rope.factor, 16.0);
  EXPECT_EQ(legacy->v4.compress_rope.attention_factor, 1.0);

  // ToJson writes transformers' form, which reads back the same.
  absl::StatusOr<ModelConfig> again = ModelConfig::FromJson(legacy->ToJson(), "again");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->v4.layer_types, legacy->v4.layer_types);
  EXPECT_EQ(again->v4.hash_layers, legacy->v4.hash_layers);
  EXPECT_EQ(again->v4.compress_rate_hca, 128);
  EXPECT_EQ(again->qk_rope_head_dim, 8);
  EXPECT_EQ(again->v4.compress_rope.factor, 16.0);
  EXPECT_EQ(again->kv_cache_row_width(), legacy->kv_cache_row_width());
}

TEST(ConfigTest, RejectsBadV4) {
  const std::string golden = std::string(MOESH_SOURCE_DIR) + "/tests/golden/v4/config.json";
  const Json base = Json::parse(*ReadFileToString(golden));
  auto code = [](const Json& j) {
    return ModelConfig::FromJson(j.dump(), "config.json").status().code();
  };
  Json j = base;
  j["layer_types"][1] = "full_attention";
  EXPECT_EQ(code(j), absl::StatusCode::kInvalidArgument);
  j = base;
  j["num_key_value_heads"] = 2;
  EXPECT_EQ(code(j), absl::StatusCode::kInvalidArgument);
  j = base;
  j["o_groups"] = 3;  // 4 heads
  EXPECT_EQ(code(j), absl::StatusCode::kInvalidArgument);
  j = base;
  j.erase("layer_types");
  j["compress_ratios"] = {0, 4, 7, 4};
  EXPECT_EQ(code(j), absl::StatusCode::kInvalidArgument);
}

TEST(ConfigTest, NewRopeParametersFormEqualsLegacy) {
  Json j = V2LiteJson();
  Json rp = j["rope_scaling"];
  rp.erase("type");
  rp["rope_type"] = "yarn";
  rp["rope_theta"] = 10000;
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = rp;
  absl::StatusOr<ModelConfig> a = Parse(V2LiteJson());
  absl::StatusOr<ModelConfig> b = Parse(j);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->rope.factor, b->rope.factor);
  EXPECT_EQ(a->rope.original_max_position_embeddings, b->rope.original_max_position_embeddings);
  EXPECT_EQ(a->rope.theta, b->rope.theta);
  EXPECT_EQ(a->SoftmaxScale(), b->SoftmaxScale());
}

TEST(ConfigTest, ToJsonRoundTrips) {
  absl::StatusOr<ModelConfig> a = Parse(V2LiteJson());
  for (bool new_form : {false, true}) {
    absl::StatusOr<ModelConfig> b = ModelConfig::FromJson(a->ToJson(new_form), "roundtrip");
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->hidden_size, a->hidden_size);
    EXPECT_EQ(b->rope.factor, a->rope.factor);
    EXPECT_EQ(b->SoftmaxScale(), a->SoftmaxScale());
    EXPECT_EQ(b->topk_method, a->topk_method);
    EXPECT_EQ(b->eos_token_ids, a->eos_token_ids);
  }
}

// DeepSeek-V3's config.json fields, as DeepSeek ships them.
Json V3Json() {
  return Json::parse(R"({
    "model_type": "deepseek_v3", "vocab_size": 129280, "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "max_position_embeddings": 163840,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
    "norm_topk_prob": true, "routed_scaling_factor": 2.5, "first_k_dense_replace": 3,
    "moe_layer_freq": 1, "rms_norm_eps": 1e-06, "bos_token_id": 0, "eos_token_id": 1,
    "tie_word_embeddings": false, "hidden_act": "silu", "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                     "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}
  })");
}

// `mkmodel --preset real` writes the published models' own config.json.
TEST(ConfigTest, RealPresetsAreThePublishedConfigs) {
  for (const auto& [family, published] : {std::pair<std::string, Json>{"v2-lite", V2LiteJson()},
                                          std::pair<std::string, Json>{"v3", V3Json()}}) {
    absl::StatusOr<ModelConfig> preset = PresetConfig(family, "real");
    ASSERT_TRUE(preset.ok()) << preset.status();
    absl::StatusOr<ModelConfig> want = Parse(published);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_EQ(Json::parse(preset->ToJson(false)), Json::parse(want->ToJson(false))) << family;
  }
  EXPECT_EQ(PresetConfig("v2", "real").status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<ModelConfig> v32 = PresetConfig("v3.2", "real");
  ASSERT_TRUE(v32.ok()) << v32.status();
  EXPECT_TRUE(v32->has_indexer());
  EXPECT_EQ(v32->indexer.topk, 2048);
  EXPECT_EQ(v32->kv_cache_row_width(), 512 + 64 + 128);
  // DeepSeek-V4-Flash: transformers' DeepseekV4Config defaults.
  absl::StatusOr<ModelConfig> v4 = PresetConfig("v4", "real");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->num_hidden_layers, 43);
  EXPECT_EQ(v4->hidden_size, 4096);
  EXPECT_EQ(v4->v4.head_dim, 512);
  EXPECT_EQ(v4->qk_rope_head_dim, 64);
  EXPECT_EQ(v4->n_routed_experts, 256);
  EXPECT_EQ(v4->num_experts_per_tok, 6);
  EXPECT_EQ(v4->indexer.topk, 512);
  EXPECT_EQ(v4->v4.compress_rate_hca, 128);
  int csa = 0;
  for (V4AttentionType t : v4->v4.layer_types) csa += t == V4AttentionType::kCompressedSparse;
  EXPECT_EQ(csa, 20);  // layers 3, 5, ..., 41
  EXPECT_EQ(v4->v4.layer_types[0], V4AttentionType::kHeavilyCompressed);
  EXPECT_EQ(v4->v4.layer_types[3], V4AttentionType::kCompressedSparse);
  EXPECT_TRUE(v4->v4.hash_layers[2]);
  EXPECT_FALSE(v4->v4.hash_layers[3]);
  EXPECT_EQ(v4->kv_cache_row_width(), 5 * 512 + 4 * 128);
}

TEST(ConfigTest, V3DefaultsToNoauxTcSigmoid) {
  Json j = V2LiteJson();
  j["model_type"] = "deepseek_v3";
  j.erase("topk_method");
  j.erase("scoring_func");
  j["n_group"] = 8;
  j["topk_group"] = 4;
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->topk_method, TopkMethod::kNoauxTc);
  EXPECT_EQ(c->scoring_func, ScoringFunc::kSigmoid);
}

struct BadCase {
  const char* name;
  std::function<void(Json&)> edit;
  const char* message;  // substring of the error
};

class ConfigErrorTest : public ::testing::TestWithParam<BadCase> {};

TEST_P(ConfigErrorTest, RejectsWithClearMessage) {
  Json j = V2LiteJson();
  GetParam().edit(j);
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find(GetParam().message), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find("config.json"), std::string::npos) << c.status();
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ConfigErrorTest,
    ::testing::Values(
        BadCase{"unknown_model", [](Json& j) { j["model_type"] = "llama"; }, "model_type"},
        BadCase{"missing_hidden", [](Json& j) { j.erase("hidden_size"); }, "hidden_size"},
        BadCase{"string_hidden", [](Json& j) { j["hidden_size"] = "2048"; }, "hidden_size"},
        BadCase{"groups_not_dividing",
                [](Json& j) {
                  j["topk_method"] = "group_limited_greedy";
                  j["n_group"] = 5;
                },
                "n_group"},
        BadCase{"topk_group_too_big",
                [](Json& j) {
                  j["topk_method"] = "group_limited_greedy";
                  j["n_group"] = 8;
                  j["topk_group"] = 9;
                },
                "topk_group"},
        BadCase{"k_unreachable",
                [](Json& j) {
                  j["topk_method"] = "group_limited_greedy";
                  j["n_group"] = 8;
                  j["topk_group"] = 1;
                  j["num_experts_per_tok"] = 9;
                },
                "num_experts_per_tok"},
        BadCase{"too_many_k", [](Json& j) { j["num_experts_per_tok"] = 65; },
                "num_experts_per_tok"},
        BadCase{"bad_method", [](Json& j) { j["topk_method"] = "random"; }, "topk_method"},
        BadCase{"bad_scoring", [](Json& j) { j["scoring_func"] = "relu"; }, "scoring_func"},
        BadCase{"kv_heads", [](Json& j) { j["num_key_value_heads"] = 8; }, "num_key_value_heads"},
        BadCase{"odd_rope", [](Json& j) { j["qk_rope_head_dim"] = 63; }, "qk_rope_head_dim"},
        BadCase{"dense_too_many", [](Json& j) { j["first_k_dense_replace"] = 28; },
                "first_k_dense_replace"},
        BadCase{"eos_outside", [](Json& j) { j["eos_token_id"] = 102400; }, "eos_token_id"},
        BadCase{"rope_type", [](Json& j) { j["rope_scaling"]["type"] = "dynamic"; }, "rope type"},
        BadCase{"rope_contradiction",
                [](Json& j) {
                  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000}};
                },
                "contradicts"},
        BadCase{"qk_head_dim", [](Json& j) { j["qk_head_dim"] = 100; }, "qk_head_dim"},
        BadCase{"activation", [](Json& j) { j["hidden_act"] = "gelu"; }, "hidden_act"},
        BadCase{"fp8_e5m2",
                [](Json& j) {
                  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e5m2"}};
                },
                "fmt \"e5m2\""},
        BadCase{
            "fp8_block_64",
            [](Json& j) {
              j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {64, 64}}};
            },
            "weight_block_size [64,64]"},
        BadCase{"awq",
                [](Json& j) {
                  j["quantization_config"] = {{"quant_method", "awq"}};
                },
                "quant_method \"awq\""},
        BadCase{
            "static_activations",
            [](Json& j) {
              j["quantization_config"] = {{"quant_method", "fp8"}, {"activation_scheme", "static"}};
            },
            "activation_scheme"}),
    [](const ::testing::TestParamInfo<BadCase>& info) { return std::string(info.param.name); });

TEST(ConfigTest, ParsesDeepSeekFp8QuantizationConfig) {
  Json j = V2LiteJson();
  j["quantization_config"] = Json::parse(R"({"activation_scheme": "dynamic", "fmt": "e4m3",
      "quant_method": "fp8", "weight_block_size": [128, 128]})");  // DeepSeek-V3's, verbatim
  absl::StatusOr<ModelConfig> c = Parse(j);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->fp8_block_weights);
  absl::StatusOr<ModelConfig> back = ModelConfig::FromJson(c->ToJson(), "round trip");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->fp8_block_weights);
  EXPECT_FALSE(Parse(V2LiteJson())->fp8_block_weights);
}

TEST(ConfigTest, NotJson) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson("{not json", "x/config.json");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelConfig::Load("/nonexistent/dir").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace moesh
