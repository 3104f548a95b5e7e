#include "common/model/config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "base/status.h"
#include "common/model/config_json.h"
#include "nlohmann/json.hpp"

namespace moesh {
namespace config_internal {

absl::Status ParseRope(const Json& params, const std::string& where, RopeConfig* rope) {
  FieldReader r(params, where);
  std::string type = "default";
  RETURN_IF_ERROR(r.String("type", &type));
  RETURN_IF_ERROR(r.String("rope_type", &type));
  if (type == "yarn") {
    rope->type = RopeType::kYarn;
  } else if (type == "default" || type == "none") {
    rope->type = RopeType::kDefault;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": rope type \"", type, "\" is not supported (default, yarn)"));
  }
  RETURN_IF_ERROR(r.Double("rope_theta", &rope->theta));
  RETURN_IF_ERROR(r.Double("factor", &rope->factor));
  RETURN_IF_ERROR(
      r.Int("original_max_position_embeddings", &rope->original_max_position_embeddings));
  RETURN_IF_ERROR(r.Double("beta_fast", &rope->beta_fast));
  RETURN_IF_ERROR(r.Double("beta_slow", &rope->beta_slow));
  RETURN_IF_ERROR(r.Double("mscale", &rope->mscale));
  RETURN_IF_ERROR(r.Double("mscale_all_dim", &rope->mscale_all_dim));
  RETURN_IF_ERROR(r.Double("attention_factor", &rope->attention_factor));
  RETURN_IF_ERROR(r.Bool("truncate", &rope->truncate));
  return absl::OkStatus();
}

absl::Status ParseEos(const Json& j, const std::string& source, std::vector<int>* out) {
  if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return absl::OkStatus();
  const Json& e = j["eos_token_id"];
  if (e.is_number_integer()) {
    out->push_back(e.get<int>());
    return absl::OkStatus();
  }
  if (!e.is_array())
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": eos_token_id must be an integer or a list"));
  for (const Json& x : e) {
    if (!x.is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": eos_token_id entries must be integers"));
    }
    out->push_back(x.get<int>());
  }
  return absl::OkStatus();
}

// quantization_config: DeepSeek's block-scaled FP8 (V3/R1/V3.2 as shipped)
// is the one this build reads; anything else is refused by name.
absl::Status ParseQuantization(const Json& q, const std::string& source, bool* fp8) {
  auto bad = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": quantization_config ", what,
        " is not supported (this build reads quant_method fp8, fmt e4m3, weight_block_size "
        "[128, 128], activation_scheme dynamic, scale_fmt ue8m0 or none)"));
  };
  if (!q.is_object()) return bad("(not an object)");
  auto str = [&](const char* key, const char* want) -> absl::Status {
    if (!q.contains(key)) return absl::OkStatus();  // DeepSeek's defaults are these
    if (!q[key].is_string() || q[key].get<std::string>() != want)
      return bad(absl::StrCat(key, " ", q[key].dump()));
    return absl::OkStatus();
  };
  if (!q.contains("quant_method")) return bad("without quant_method");
  RETURN_IF_ERROR(str("quant_method", "fp8"));
  RETURN_IF_ERROR(str("fmt", "e4m3"));
  RETURN_IF_ERROR(str("activation_scheme", "dynamic"));
  RETURN_IF_ERROR(str("scale_fmt", "ue8m0"));  // DeepSeek-V4's power-of-two block scales
  if (q.contains("weight_block_size") && q["weight_block_size"] != Json::array({128, 128}))
    return bad(absl::StrCat("weight_block_size ", q["weight_block_size"].dump()));
  *fp8 = true;
  return absl::OkStatus();
}

Json RopeJson(const RopeConfig& r, double partial_rotary_factor) {
  Json j;
  j["rope_type"] = r.type == RopeType::kYarn ? "yarn" : "default";
  j["rope_theta"] = r.theta;
  j["partial_rotary_factor"] = partial_rotary_factor;
  if (r.type == RopeType::kYarn) {
    j["factor"] = r.factor;
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
    j["beta_fast"] = r.beta_fast;
    j["beta_slow"] = r.beta_slow;
    if (r.attention_factor != 0) j["attention_factor"] = r.attention_factor;
  }
  return j;
}

}  // namespace config_internal

namespace {

using config_internal::FieldReader;
using config_internal::Json;
using config_internal::ParseEos;
using config_internal::ParseRope;
using config_internal::ParseV4;
using config_internal::V4ToJson;

bool SameRope(const RopeConfig& a, const RopeConfig& b) {
  return a.type == b.type && a.theta == b.theta && a.factor == b.factor &&
         a.original_max_position_embeddings == b.original_max_position_embeddings &&
         a.beta_fast == b.beta_fast && a.beta_slow == b.beta_slow && a.mscale == b.mscale &&
         a.mscale_all_dim == b.mscale_all_dim;
}

}  // namespace

double YarnGetMscale(double scale, double mscale) {
  if (scale <= 1.0) return 1.0;
  return 0.1 * mscale * std::log(scale) + 1.0;
}

double ModelConfig::SoftmaxScale() const {
  double scale = 1.0 / std::sqrt(static_cast<double>(qk_head_dim()));
  if (rope.type == RopeType::kYarn && rope.mscale_all_dim != 0.0) {
    const double m = YarnGetMscale(rope.factor, rope.mscale_all_dim);
    scale *= m * m;
  }
  return scale;
}

absl::StatusOr<ModelConfig> ModelConfig::FromJson(const std::string& text,
                                                  const std::string& source) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a JSON object"));
  }
  ModelConfig c;
  FieldReader r(j, source);
  RETURN_IF_ERROR(r.String("model_type", &c.model_type));
  const FamilyTraits* family = FindFamily(c.model_type);
  if (family == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": model_type \"", c.model_type,
                                                   "\" is not supported (", SupportedModelTypes(),
                                                   ")"));
  }
  c.family = family->id;
  c.topk_method = family->default_topk_method;
  c.scoring_func = family->default_scoring_func;
  if (r.Has("quantization_config"))
    RETURN_IF_ERROR(
        config_internal::ParseQuantization(j["quantization_config"], source, &c.fp8_block_weights));
  if (family->layers == LayerArch::kV4) {
    RETURN_IF_ERROR(ParseV4(j, source, &c));
    if (c.fp8_block_weights) {
      // DeepSeek-V4 ships its routed experts in MXFP4 unless config.json says
      // expert_dtype fp8 (vLLM's reading, default fp4).
      std::string experts = "fp4";
      if (j.contains("expert_dtype")) {
        if (!j["expert_dtype"].is_string())
          return absl::InvalidArgumentError(
              absl::StrCat(source, ": expert_dtype must be a string"));
        experts = j["expert_dtype"].get<std::string>();
      }
      if (experts != "fp4" && experts != "fp8") {
        return absl::InvalidArgumentError(absl::StrCat(source, ": expert_dtype \"", experts,
                                                       "\" is not supported (fp4: MXFP4, or fp8)"));
      }
      c.mxfp4_experts = experts == "fp4";
    }
    RETURN_IF_ERROR(c.Validate(source));
    return c;
  }
  RETURN_IF_ERROR(r.Int("vocab_size", &c.vocab_size, /*required=*/true));
  RETURN_IF_ERROR(r.Int("hidden_size", &c.hidden_size, true));
  RETURN_IF_ERROR(r.Int("intermediate_size", &c.intermediate_size, true));
  RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c.moe_intermediate_size));
  RETURN_IF_ERROR(r.Int("num_hidden_layers", &c.num_hidden_layers, true));
  RETURN_IF_ERROR(r.Int("num_attention_heads", &c.num_attention_heads, true));
  RETURN_IF_ERROR(r.Int("max_position_embeddings", &c.max_position_embeddings));
  RETURN_IF_ERROR(r.Double("rms_norm_eps", &c.rms_norm_eps));
  RETURN_IF_ERROR(r.Int("q_lora_rank", &c.q_lora_rank));
  RETURN_IF_ERROR(r.Int("kv_lora_rank", &c.kv_lora_rank, true));
  RETURN_IF_ERROR(r.Int("qk_nope_head_dim", &c.qk_nope_head_dim, true));
  RETURN_IF_ERROR(r.Int("qk_rope_head_dim", &c.qk_rope_head_dim, true));
  RETURN_IF_ERROR(r.Int("v_head_dim", &c.v_head_dim, true));
  RETURN_IF_ERROR(r.Bool("rope_interleave", &c.rope_interleave));
  // transformers' V2 and V3.2 attention rotate interleaved pairs whatever the config says.
  if (!family->rope_interleave_option) c.rope_interleave = true;
  if (c.has_indexer()) {
    RETURN_IF_ERROR(r.Int("index_topk", &c.indexer.topk, true));
    RETURN_IF_ERROR(r.Int("index_head_dim", &c.indexer.head_dim, true));
    RETURN_IF_ERROR(r.Int("index_n_heads", &c.indexer.n_heads, true));
  }

  // n_routed_experts null means a dense model.
  RETURN_IF_ERROR(r.Int("n_routed_experts", &c.n_routed_experts));
  RETURN_IF_ERROR(r.Int("n_shared_experts", &c.n_shared_experts));
  RETURN_IF_ERROR(r.Int("num_experts_per_tok", &c.num_experts_per_tok));
  RETURN_IF_ERROR(r.Int("n_group", &c.n_group));
  RETURN_IF_ERROR(r.Int("topk_group", &c.topk_group));
  std::string method;
  RETURN_IF_ERROR(r.String("topk_method", &method));
  if (method == "greedy" || method == "gready") {  // DeepSeek-V2's own default is spelt "gready"
    c.topk_method = TopkMethod::kGreedy;
  } else if (method == "group_limited_greedy") {
    c.topk_method = TopkMethod::kGroupLimitedGreedy;
  } else if (method == "noaux_tc") {
    c.topk_method = TopkMethod::kNoauxTc;
  } else if (!method.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": topk_method \"", method,
                     "\" is not supported (greedy, group_limited_greedy, noaux_tc)"));
  }
  std::string scoring;
  RETURN_IF_ERROR(r.String("scoring_func", &scoring));
  if (scoring == "softmax") {
    c.scoring_func = ScoringFunc::kSoftmax;
  } else if (scoring == "sigmoid") {
    c.scoring_func = ScoringFunc::kSigmoid;
  } else if (!scoring.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": scoring_func \"", scoring,
                                                   "\" is not supported (softmax, sigmoid)"));
  }
  RETURN_IF_ERROR(r.Bool("norm_topk_prob", &c.norm_topk_prob));
  RETURN_IF_ERROR(r.Double("routed_scaling_factor", &c.routed_scaling_factor));
  RETURN_IF_ERROR(r.Int("first_k_dense_replace", &c.first_k_dense_replace));
  RETURN_IF_ERROR(r.Int("moe_layer_freq", &c.moe_layer_freq));
  if (r.Has("mlp_layer_types")) {
    // transformers' per-layer spelling ("dense" / "sparse"); it must describe the
    // same layers as first_k_dense_replace and moe_layer_freq, which the engine uses.
    const Json& types = j["mlp_layer_types"];
    if (!types.is_array() || types.size() != static_cast<size_t>(c.num_hidden_layers)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": mlp_layer_types must list one entry per layer (num_hidden_layers = ",
          c.num_hidden_layers, ")"));
    }
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const Json& t = types[l];
      if (!t.is_string() || (t != "dense" && t != "sparse")) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": mlp_layer_types[", l, "] must be \"dense\" or \"sparse\", got ", t.dump()));
      }
      if (c.moe_layer_freq > 0 && (t == "sparse") != c.IsMoeLayer(l)) {
        return absl::InvalidArgumentError(absl::StrCat(
            source, ": mlp_layer_types[", l, "] is \"", t.get<std::string>(),
            "\" but first_k_dense_replace / moe_layer_freq / n_routed_experts make layer ", l,
            c.IsMoeLayer(l) ? " an MoE layer" : " a dense layer"));
      }
    }
  }
  RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c.tie_word_embeddings));
  RETURN_IF_ERROR(r.Int("bos_token_id", &c.bos_token_id));
  if (r.Has("eos_token_id")) {
    const Json& e = j["eos_token_id"];
    if (e.is_number_integer()) {
      c.eos_token_ids.push_back(e.get<int>());
    } else if (e.is_array()) {
      for (const Json& x : e) {
        if (!x.is_number_integer()) {
          return absl::InvalidArgumentError(
              absl::StrCat(source, ": eos_token_id entries must be integers"));
        }
        c.eos_token_ids.push_back(x.get<int>());
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": eos_token_id must be an integer or a list"));
    }
  }
  std::string act = "silu";
  RETURN_IF_ERROR(r.String("hidden_act", &act));
  if (act != "silu") {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": hidden_act \"", act, "\" is not supported (silu)"));
  }
  int kv_heads = c.num_attention_heads;
  RETURN_IF_ERROR(r.Int("num_key_value_heads", &kv_heads));
  if (kv_heads != c.num_attention_heads) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": num_key_value_heads (", kv_heads,
                                                   ") must equal num_attention_heads (",
                                                   c.num_attention_heads, ") for MLA"));
  }

  if (r.Has("qk_head_dim")) {
    int qk_head_dim = 0;
    RETURN_IF_ERROR(r.Int("qk_head_dim", &qk_head_dim));
    if (qk_head_dim != c.qk_nope_head_dim + c.qk_rope_head_dim) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": qk_head_dim (", qk_head_dim,
                       ") must equal qk_nope_head_dim + qk_rope_head_dim (",
                       c.qk_nope_head_dim + c.qk_rope_head_dim, ")"));
    }
  }

  // Rope: legacy rope_theta + rope_scaling, or rope_parameters; both must agree.
  bool have_legacy = false;
  RopeConfig legacy;
  if (r.Has("rope_theta") || r.Has("rope_scaling")) {
    have_legacy = true;
    RETURN_IF_ERROR(r.Double("rope_theta", &legacy.theta));
    if (r.Has("rope_scaling")) {
      if (!j["rope_scaling"].is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": rope_scaling must be an object"));
      }
      RETURN_IF_ERROR(ParseRope(j["rope_scaling"], source + " rope_scaling", &legacy));
    }
  }
  if (r.Has("rope_parameters")) {
    if (!j["rope_parameters"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": rope_parameters must be an object"));
    }
    RETURN_IF_ERROR(ParseRope(j["rope_parameters"], source + " rope_parameters", &c.rope));
    if (have_legacy && !SameRope(legacy, c.rope)) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": rope_parameters contradicts rope_theta/rope_scaling; give one form"));
    }
  } else if (have_legacy) {
    c.rope = legacy;
  }
  RETURN_IF_ERROR(c.Validate(source));
  return c;
}

namespace config_internal {

absl::Status CheckPositive(const std::string& source, std::initializer_list<NamedInt> fields) {
  for (const NamedInt& f : fields) {
    if (f.value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", f.name, " must be positive, got ", f.value));
    }
  }
  return absl::OkStatus();
}

}  // namespace config_internal

absl::StatusOr<ModelConfig> ModelConfig::Load(const std::string& dir) {
  const std::string path = JoinPath(dir, "config.json");
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

absl::Status ModelConfig::Validate(const std::string& source) const {
  RETURN_IF_ERROR(
      config_internal::CheckPositive(source, {{"vocab_size", vocab_size},
                                              {"hidden_size", hidden_size},
                                              {"num_hidden_layers", num_hidden_layers},
                                              {"num_attention_heads", num_attention_heads}}));
  RETURN_IF_ERROR(layers() == LayerArch::kV4 ? ValidateV4(source) : ValidateMla(source));
  if (mxfp4_experts && (layers() != LayerArch::kV4 || !fp8_block_weights)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": MXFP4 experts are DeepSeek-V4's (with its FP8 linears) only"));
  }
  for (int e : eos_token_ids) {
    if (e < 0 || e >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": eos_token_id ", e, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ModelConfig::ValidateMla(const std::string& source) const {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", why));
  };
  RETURN_IF_ERROR(config_internal::CheckPositive(source, {{"kv_lora_rank", kv_lora_rank},
                                                          {"qk_nope_head_dim", qk_nope_head_dim},
                                                          {"qk_rope_head_dim", qk_rope_head_dim},
                                                          {"v_head_dim", v_head_dim},
                                                          {"moe_layer_freq", moe_layer_freq}}));
  if (q_lora_rank < 0) return bad("q_lora_rank must be null or positive");
  if (has_indexer()) {
    if (q_lora_rank <= 0)
      return bad("deepseek_v32 needs q_lora_rank: the indexer reads its latent");
    if (indexer.topk <= 0 || indexer.n_heads <= 0)
      return bad("index_topk and index_n_heads must be positive");
    if (indexer.head_dim < qk_rope_head_dim) {
      return bad(absl::StrCat("index_head_dim (", indexer.head_dim,
                              ") must be at least qk_rope_head_dim (", qk_rope_head_dim, ")"));
    }
  }
  if (qk_rope_head_dim % 2 != 0) return bad("qk_rope_head_dim must be even");
  if (first_k_dense_replace < 0 || first_k_dense_replace > num_hidden_layers) {
    return bad(absl::StrCat("first_k_dense_replace (", first_k_dense_replace,
                            ") must lie in [0, num_hidden_layers = ", num_hidden_layers, "]"));
  }
  if (first_k_dense_replace > 0 && intermediate_size <= 0) {
    return bad("dense layers need a positive intermediate_size");
  }
  if (n_routed_experts < 0) return bad("n_routed_experts must not be negative");
  if (n_routed_experts > 0) {
    if (moe_intermediate_size <= 0) return bad("moe_intermediate_size must be positive");
    if (num_experts_per_tok <= 0 || num_experts_per_tok > n_routed_experts) {
      return bad(absl::StrCat("num_experts_per_tok (", num_experts_per_tok,
                              ") must lie in [1, n_routed_experts = ", n_routed_experts, "]"));
    }
    if (n_shared_experts < 0) return bad("n_shared_experts must not be negative");
    if (topk_method != TopkMethod::kGreedy) {
      if (n_group <= 0 || n_routed_experts % n_group != 0) {
        return bad(absl::StrCat("n_routed_experts (", n_routed_experts,
                                ") must be divisible by n_group (", n_group, ")"));
      }
      if (topk_group <= 0 || topk_group > n_group) {
        return bad(
            absl::StrCat("topk_group (", topk_group, ") must lie in [1, n_group = ", n_group, "]"));
      }
      const int reachable = topk_group * (n_routed_experts / n_group);
      if (num_experts_per_tok > reachable) {
        return bad(absl::StrCat("num_experts_per_tok (", num_experts_per_tok, ") exceeds the ",
                                reachable, " experts in topk_group (", topk_group, ") groups"));
      }
      if (topk_method == TopkMethod::kNoauxTc && n_routed_experts / n_group < 2) {
        return bad(
            "noaux_tc scores groups by their top-2 experts: n_routed_experts / n_group must be >= "
            "2");
      }
    }
  }
  if (rope.theta <= 0) return bad("rope_theta must be positive");
  if (rope.type == RopeType::kYarn) {
    if (rope.factor <= 0) return bad("rope_scaling.factor must be positive for yarn");
    if (rope.original_max_position_embeddings < 0) {
      return bad("rope_scaling.original_max_position_embeddings must be positive");
    }
    if (rope.original_max_position_embeddings == 0 && max_position_embeddings <= 0) {
      return bad("yarn needs original_max_position_embeddings or max_position_embeddings");
    }
  }
  return absl::OkStatus();
}

int ModelConfig::kv_cache_row_width() const {
  if (layers() == LayerArch::kMla)
    return kv_lora_rank + qk_rope_head_dim + (has_indexer() ? indexer.head_dim : 0);
  int width = 0;
  for (int l = 0; l < num_hidden_layers; ++l) width = std::max(width, V4RowWidth(l));
  return width;
}

std::string ModelConfig::Fingerprint() const {
  return absl::StrCat(model_type, "/L", num_hidden_layers, "/H", hidden_size, "/E",
                      n_routed_experts, "/V", vocab_size);
}

std::string ModelConfig::ToJson(bool new_rope_form) const {
  if (layers() == LayerArch::kV4) return V4ToJson(*this);
  Json j;
  j["model_type"] = model_type;
  j["architectures"] = {std::string(traits().architecture)};
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_attention_heads;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  if (fp8_block_weights) {
    j["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"weight_block_size", {128, 128}},
                                {"activation_scheme", "dynamic"}};
  }
  j["q_lora_rank"] = q_lora_rank > 0 ? Json(q_lora_rank) : Json(nullptr);
  j["kv_lora_rank"] = kv_lora_rank;
  j["qk_nope_head_dim"] = qk_nope_head_dim;
  j["qk_rope_head_dim"] = qk_rope_head_dim;
  j["v_head_dim"] = v_head_dim;
  if (traits().rope_interleave_option) j["rope_interleave"] = rope_interleave;
  if (has_indexer()) {
    j["index_topk"] = indexer.topk;
    j["index_head_dim"] = indexer.head_dim;
    j["index_n_heads"] = indexer.n_heads;
  }
  j["n_routed_experts"] = n_routed_experts;
  j["n_shared_experts"] = n_shared_experts;
  j["num_experts_per_tok"] = num_experts_per_tok;
  j["n_group"] = n_group;
  j["topk_group"] = topk_group;
  j["topk_method"] = topk_method == TopkMethod::kGreedy               ? "greedy"
                     : topk_method == TopkMethod::kGroupLimitedGreedy ? "group_limited_greedy"
                                                                      : "noaux_tc";
  j["scoring_func"] = scoring_func == ScoringFunc::kSoftmax ? "softmax" : "sigmoid";
  j["norm_topk_prob"] = norm_topk_prob;
  j["routed_scaling_factor"] = routed_scaling_factor;
  j["first_k_dense_replace"] = first_k_dense_replace;
  j["moe_layer_freq"] = moe_layer_freq;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_ids.size() == 1) j["eos_token_id"] = eos_token_ids[0];
  if (eos_token_ids.size() > 1) j["eos_token_id"] = eos_token_ids;
  j["torch_dtype"] = "bfloat16";
  Json scaling = Json::object();
  if (rope.type == RopeType::kYarn) {
    scaling["factor"] = rope.factor;
    if (rope.original_max_position_embeddings > 0) {
      scaling["original_max_position_embeddings"] = rope.original_max_position_embeddings;
    }
    scaling["beta_fast"] = rope.beta_fast;
    scaling["beta_slow"] = rope.beta_slow;
    if (rope.mscale != 0) scaling["mscale"] = rope.mscale;
    if (rope.mscale_all_dim != 0) scaling["mscale_all_dim"] = rope.mscale_all_dim;
  }
  if (new_rope_form) {
    scaling["rope_type"] = rope.type == RopeType::kYarn ? "yarn" : "default";
    scaling["rope_theta"] = rope.theta;
    j["rope_parameters"] = scaling;
  } else {
    j["rope_theta"] = rope.theta;
    if (rope.type == RopeType::kYarn) {
      scaling["type"] = "yarn";
      j["rope_scaling"] = scaling;
    } else {
      j["rope_scaling"] = nullptr;
    }
  }
  return j.dump(2);
}

}  // namespace moesh
