#include "common/model/config.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace moesh {
namespace {

using Json = nlohmann::json;

// Typed field readers: absent or null keeps the default; a wrong type is an error.
class FieldReader {
 public:
  FieldReader(const Json& j, const std::string& source) : j_(j), source_(source) {}

  absl::Status Int(const char* key, int* out, bool required = false) const {
    if (!Has(key)) return required ? Missing(key) : absl::OkStatus();
    const Json& v = j_.at(key);
    if (!v.is_number_integer()) return WrongType(key, "an integer");
    *out = v.get<int>();
    return absl::OkStatus();
  }
  absl::Status Double(const char* key, double* out) const {
    if (!Has(key)) return absl::OkStatus();
    const Json& v = j_.at(key);
    if (!v.is_number()) return WrongType(key, "a number");
    *out = v.get<double>();
    return absl::OkStatus();
  }
  absl::Status Bool(const char* key, bool* out) const {
    if (!Has(key)) return absl::OkStatus();
    const Json& v = j_.at(key);
    if (!v.is_boolean()) return WrongType(key, "true or false");
    *out = v.get<bool>();
    return absl::OkStatus();
  }
  absl::Status String(const char* key, std::string* out) const {
    if (!Has(key)) return absl::OkStatus();
    const Json& v = j_.at(key);
    if (!v.is_string()) return WrongType(key, "a string");
    *out = v.get<std::string>();
    return absl::OkStatus();
  }
  bool Has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

 private:
  absl::Status Missing(const char* key) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": required field \"", key, "\" is missing"));
  }
  absl::Status WrongType(const char* key, const char* want) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": field \"", key, "\" must be ", want, ", got ", j_.at(key).dump()));
  }
  const Json& j_;
  const std::string& source_;
};

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
  RETURN_IF_ERROR(r.Int("original_max_position_embeddings", &rope->original_max_position_embeddings));
  RETURN_IF_ERROR(r.Double("beta_fast", &rope->beta_fast));
  RETURN_IF_ERROR(r.Double("beta_slow", &rope->beta_slow));
  RETURN_IF_ERROR(r.Double("mscale", &rope->mscale));
  RETURN_IF_ERROR(r.Double("mscale_all_dim", &rope->mscale_all_dim));
  RETURN_IF_ERROR(r.Double("attention_factor", &rope->attention_factor));
  RETURN_IF_ERROR(r.Bool("truncate", &rope->truncate));
  return absl::OkStatus();
}

// eos_token_id: an integer or a list of them.
absl::Status ParseEos(const Json& j, const std::string& source, std::vector<int>* out) {
  if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return absl::OkStatus();
  const Json& e = j["eos_token_id"];
  if (e.is_number_integer()) {
    out->push_back(e.get<int>());
    return absl::OkStatus();
  }
  if (!e.is_array()) return absl::InvalidArgumentError(absl::StrCat(source, ": eos_token_id must be an integer or a list"));
  for (const Json& x : e) {
    if (!x.is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": eos_token_id entries must be integers"));
    }
    out->push_back(x.get<int>());
  }
  return absl::OkStatus();
}

// DeepSeek-V4's fields, in transformers' spelling (layer_types, mlp_layer_types,
// compress_rates, partial_rotary_factor, rope_parameters {main, compress}) or
// DeepSeek's own (compress_ratios, num_hash_layers, qk_rope_head_dim,
// rope_theta + compress_rope_theta + rope_scaling), with transformers' defaults.
absl::Status ParseV4(const Json& j, const std::string& source, ModelConfig* c) {
  FieldReader r(j, source);
  auto bad = [&](const std::string& why) { return absl::InvalidArgumentError(absl::StrCat(source, ": ", why)); };
  RETURN_IF_ERROR(r.Int("vocab_size", &c->vocab_size, true));
  RETURN_IF_ERROR(r.Int("hidden_size", &c->hidden_size, true));
  RETURN_IF_ERROR(r.Int("num_hidden_layers", &c->num_hidden_layers, true));
  RETURN_IF_ERROR(r.Int("num_attention_heads", &c->num_attention_heads, true));
  RETURN_IF_ERROR(r.Int("head_dim", &c->head_dim, true));
  RETURN_IF_ERROR(r.Int("q_lora_rank", &c->q_lora_rank, true));
  RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c->moe_intermediate_size, true));
  RETURN_IF_ERROR(r.Int("n_routed_experts", &c->n_routed_experts, true));
  RETURN_IF_ERROR(r.Int("num_experts_per_tok", &c->num_experts_per_tok, true));
  RETURN_IF_ERROR(r.Int("o_groups", &c->o_groups, true));
  RETURN_IF_ERROR(r.Int("o_lora_rank", &c->o_lora_rank, true));
  RETURN_IF_ERROR(r.Int("sliding_window", &c->sliding_window, true));
  RETURN_IF_ERROR(r.Int("hc_mult", &c->hc_mult, true));
  c->n_shared_experts = 1;
  RETURN_IF_ERROR(r.Int("n_shared_experts", &c->n_shared_experts));
  c->hc_sinkhorn_iters = 20;
  RETURN_IF_ERROR(r.Int("hc_sinkhorn_iters", &c->hc_sinkhorn_iters));
  RETURN_IF_ERROR(r.Double("hc_eps", &c->hc_eps));
  c->swiglu_limit = 10.0;
  RETURN_IF_ERROR(r.Double("swiglu_limit", &c->swiglu_limit));
  RETURN_IF_ERROR(r.Int("max_position_embeddings", &c->max_position_embeddings));
  RETURN_IF_ERROR(r.Double("rms_norm_eps", &c->rms_norm_eps));
  c->routed_scaling_factor = 1.5;
  RETURN_IF_ERROR(r.Double("routed_scaling_factor", &c->routed_scaling_factor));
  RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c->tie_word_embeddings));
  RETURN_IF_ERROR(r.Int("bos_token_id", &c->bos_token_id));
  RETURN_IF_ERROR(ParseEos(j, source, &c->eos_token_ids));
  RETURN_IF_ERROR(r.Int("index_topk", &c->index_topk));
  RETURN_IF_ERROR(r.Int("index_head_dim", &c->index_head_dim));
  RETURN_IF_ERROR(r.Int("index_n_heads", &c->index_n_heads));
  int kv_heads = 1;
  RETURN_IF_ERROR(r.Int("num_key_value_heads", &kv_heads));
  if (kv_heads != 1) return bad(absl::StrCat("num_key_value_heads must be 1 (shared-KV MQA), got ", kv_heads));
  std::string act = "silu";
  RETURN_IF_ERROR(r.String("hidden_act", &act));
  if (act != "silu") return bad(absl::StrCat("hidden_act \"", act, "\" is not supported (silu)"));
  std::string scoring = "sqrtsoftplus";
  RETURN_IF_ERROR(r.String("scoring_func", &scoring));
  if (scoring == "sqrtsoftplus") {
    c->scoring_func = ScoringFunc::kSqrtSoftplus;
  } else if (scoring == "sigmoid") {
    c->scoring_func = ScoringFunc::kSigmoid;
  } else if (scoring == "softmax") {
    c->scoring_func = ScoringFunc::kSoftmax;
  } else {
    return bad(absl::StrCat("scoring_func \"", scoring, "\" is not supported (sqrtsoftplus, sigmoid, softmax)"));
  }
  // transformers' V4 routers always renormalise and pick the top-k of the
  // biased scores over all experts.
  c->topk_method = TopkMethod::kGreedy;
  c->norm_topk_prob = true;
  c->first_k_dense_replace = 0;
  c->moe_layer_freq = 1;
  const int n = c->num_hidden_layers;

  // Compress rates, then the attention type of every layer.
  if (r.Has("compress_rates")) {
    const Json& rates = j["compress_rates"];
    if (!rates.is_object()) return bad("compress_rates must be an object");
    FieldReader rr(rates, source + " compress_rates");
    RETURN_IF_ERROR(rr.Int("compressed_sparse_attention", &c->compress_rate_csa));
    RETURN_IF_ERROR(rr.Int("heavily_compressed_attention", &c->compress_rate_hca));
  }
  RETURN_IF_ERROR(r.Int("compress_rate_csa", &c->compress_rate_csa));
  RETURN_IF_ERROR(r.Int("compress_rate_hca", &c->compress_rate_hca));
  c->layer_types.clear();
  if (r.Has("layer_types")) {
    const Json& types = j["layer_types"];
    if (!types.is_array()) return bad("layer_types must be a list");
    for (const Json& t : types) {
      if (t == "sliding_attention") {
        c->layer_types.push_back(V4AttentionType::kSliding);
      } else if (t == "compressed_sparse_attention") {
        c->layer_types.push_back(V4AttentionType::kCompressedSparse);
      } else if (t == "heavily_compressed_attention") {
        c->layer_types.push_back(V4AttentionType::kHeavilyCompressed);
      } else {
        return bad(absl::StrCat("layer_types entry ", t.dump(), " is not one of sliding_attention, "
                                "compressed_sparse_attention, heavily_compressed_attention"));
      }
    }
  } else if (r.Has("compress_ratios")) {
    // DeepSeek's per-layer ratios: 0 sliding, 4 CSA, 128 HCA (as transformers maps them).
    const Json& ratios = j["compress_ratios"];
    if (!ratios.is_array()) return bad("compress_ratios must be a list");
    for (const Json& x : ratios) {
      const int ratio = x.is_number_integer() ? x.get<int>() : -1;
      if (ratio == 0) {
        c->layer_types.push_back(V4AttentionType::kSliding);
      } else if (ratio == 4) {
        c->layer_types.push_back(V4AttentionType::kCompressedSparse);
      } else if (ratio == 128) {
        c->layer_types.push_back(V4AttentionType::kHeavilyCompressed);
      } else {
        return bad(absl::StrCat("compress_ratios entry ", x.dump(), " is not 0, 4 or 128"));
      }
    }
  } else {
    // transformers' default: two HCA layers, then CSA and HCA alternating.
    for (int l = 0; l < n; ++l) {
      c->layer_types.push_back(l < 2 || l % 2 == 0 ? V4AttentionType::kHeavilyCompressed
                                                   : V4AttentionType::kCompressedSparse);
    }
  }
  if (static_cast<int>(c->layer_types.size()) < n) {
    return bad(absl::StrCat("layer_types / compress_ratios list ", c->layer_types.size(), " layers, num_hidden_layers is ", n));
  }
  c->layer_types.resize(n);  // an MTP layer's entry may follow

  c->hash_layers.assign(n, false);
  if (r.Has("mlp_layer_types")) {
    const Json& types = j["mlp_layer_types"];
    if (!types.is_array() || static_cast<int>(types.size()) < n) return bad("mlp_layer_types must list every layer");
    for (int l = 0; l < n; ++l) {
      if (types[l] != "hash_moe" && types[l] != "moe") {
        return bad(absl::StrCat("mlp_layer_types[", l, "] must be \"hash_moe\" or \"moe\", got ", types[l].dump()));
      }
      c->hash_layers[l] = types[l] == "hash_moe";
    }
  } else {
    int num_hash = 3;  // transformers' default
    RETURN_IF_ERROR(r.Int("num_hash_layers", &num_hash));
    for (int l = 0; l < n && l < num_hash; ++l) c->hash_layers[l] = true;
  }

  // Partial rope: the last qk_rope_head_dim dims of each head.
  double partial = 0.0;
  RETURN_IF_ERROR(r.Double("partial_rotary_factor", &partial));
  int legacy_rope_dim = 0;
  RETURN_IF_ERROR(r.Int("qk_rope_head_dim", &legacy_rope_dim));
  c->rope = RopeConfig();
  c->compress_rope = RopeConfig();
  c->compress_rope.theta = 160000.0;
  RETURN_IF_ERROR(r.Double("rope_theta", &c->rope.theta));
  RETURN_IF_ERROR(r.Double("compress_rope_theta", &c->compress_rope.theta));
  if (r.Has("rope_parameters")) {
    const Json& rp = j["rope_parameters"];
    if (!rp.is_object()) return bad("rope_parameters must be an object");
    if (rp.contains("main") && rp.contains("compress")) {
      RETURN_IF_ERROR(ParseRope(rp["main"], source + " rope_parameters.main", &c->rope));
      RETURN_IF_ERROR(ParseRope(rp["compress"], source + " rope_parameters.compress", &c->compress_rope));
      FieldReader cr(rp["compress"], source);
      if (partial == 0.0) RETURN_IF_ERROR(cr.Double("partial_rotary_factor", &partial));
    } else {
      // One flat set: the compressed layers' scaling (main stays plain).
      const double theta = c->compress_rope.theta;
      RETURN_IF_ERROR(ParseRope(rp, source + " rope_parameters", &c->compress_rope));
      c->compress_rope.theta = theta;
    }
  } else if (r.Has("rope_scaling")) {
    if (!j["rope_scaling"].is_object()) return bad("rope_scaling must be an object");
    const double theta = c->compress_rope.theta;
    RETURN_IF_ERROR(ParseRope(j["rope_scaling"], source + " rope_scaling", &c->compress_rope));
    c->compress_rope.theta = theta;
  }
  // The V4 reference leaves YaRN's magnitude scale out of cos and sin.
  if (c->compress_rope.type == RopeType::kYarn && c->compress_rope.attention_factor == 0.0) {
    c->compress_rope.attention_factor = 1.0;
  }
  if (partial > 0.0) {
    c->qk_rope_head_dim = static_cast<int>(c->head_dim * partial);
  } else if (legacy_rope_dim > 0) {
    c->qk_rope_head_dim = legacy_rope_dim;
  } else {
    c->qk_rope_head_dim = c->head_dim / 8;  // transformers' default factor 64 / 512
  }
  return absl::OkStatus();
}

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
  if (c.model_type == "deepseek_v2") {
    c.family = ModelFamily::kDeepseekV2;
    c.topk_method = TopkMethod::kGreedy;
    c.scoring_func = ScoringFunc::kSoftmax;
  } else if (c.model_type == "deepseek_v3") {
    c.family = ModelFamily::kDeepseekV3;
    c.topk_method = TopkMethod::kNoauxTc;
    c.scoring_func = ScoringFunc::kSigmoid;
  } else if (c.model_type == "deepseek_v32") {
    c.family = ModelFamily::kDeepseekV32;
    c.topk_method = TopkMethod::kNoauxTc;
    c.scoring_func = ScoringFunc::kSigmoid;
  } else if (c.model_type == "deepseek_v4") {
    c.family = ModelFamily::kDeepseekV4;
    RETURN_IF_ERROR(ParseV4(j, source, &c));
    RETURN_IF_ERROR(c.Validate(source));
    return c;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": model_type \"", c.model_type,
                     "\" is not supported (deepseek_v2, deepseek_v3, deepseek_v32, deepseek_v4)"));
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
  if (c.family == ModelFamily::kDeepseekV2 || c.family == ModelFamily::kDeepseekV32) c.rope_interleave = true;
  if (c.has_indexer()) {
    RETURN_IF_ERROR(r.Int("index_topk", &c.index_topk, true));
    RETURN_IF_ERROR(r.Int("index_head_dim", &c.index_head_dim, true));
    RETURN_IF_ERROR(r.Int("index_n_heads", &c.index_n_heads, true));
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
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": topk_method \"", method, "\" is not supported (greedy, group_limited_greedy, noaux_tc)"));
  }
  std::string scoring;
  RETURN_IF_ERROR(r.String("scoring_func", &scoring));
  if (scoring == "softmax") {
    c.scoring_func = ScoringFunc::kSoftmax;
  } else if (scoring == "sigmoid") {
    c.scoring_func = ScoringFunc::kSigmoid;
  } else if (!scoring.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": scoring_func \"", scoring, "\" is not supported (softmax, sigmoid)"));
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
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": mlp_layer_types must list one entry per layer (num_hidden_layers = ",
                       c.num_hidden_layers, ")"));
    }
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const Json& t = types[l];
      if (!t.is_string() || (t != "dense" && t != "sparse")) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": mlp_layer_types[", l, "] must be \"dense\" or \"sparse\", got ", t.dump()));
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
          return absl::InvalidArgumentError(absl::StrCat(source, ": eos_token_id entries must be integers"));
        }
        c.eos_token_ids.push_back(x.get<int>());
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(source, ": eos_token_id must be an integer or a list"));
    }
  }
  std::string act = "silu";
  RETURN_IF_ERROR(r.String("hidden_act", &act));
  if (act != "silu") {
    return absl::InvalidArgumentError(absl::StrCat(source, ": hidden_act \"", act, "\" is not supported (silu)"));
  }
  int kv_heads = c.num_attention_heads;
  RETURN_IF_ERROR(r.Int("num_key_value_heads", &kv_heads));
  if (kv_heads != c.num_attention_heads) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": num_key_value_heads (", kv_heads, ") must equal num_attention_heads (",
        c.num_attention_heads, ") for MLA"));
  }

  if (r.Has("qk_head_dim")) {
    int qk_head_dim = 0;
    RETURN_IF_ERROR(r.Int("qk_head_dim", &qk_head_dim));
    if (qk_head_dim != c.qk_nope_head_dim + c.qk_rope_head_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": qk_head_dim (", qk_head_dim, ") must equal qk_nope_head_dim + qk_rope_head_dim (",
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
      return absl::InvalidArgumentError(absl::StrCat(source, ": rope_parameters must be an object"));
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

absl::StatusOr<ModelConfig> ModelConfig::Load(const std::string& dir) {
  const std::string path = JoinPath(dir, "config.json");
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

absl::Status ModelConfig::Validate(const std::string& source) const {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", why));
  };
  if (is_v4()) return ValidateV4(source);
  struct Positive {
    const char* name;
    int value;
  };
  for (const Positive& p : {Positive{"vocab_size", vocab_size}, {"hidden_size", hidden_size},
                            {"num_hidden_layers", num_hidden_layers},
                            {"num_attention_heads", num_attention_heads},
                            {"kv_lora_rank", kv_lora_rank}, {"qk_nope_head_dim", qk_nope_head_dim},
                            {"qk_rope_head_dim", qk_rope_head_dim}, {"v_head_dim", v_head_dim},
                            {"moe_layer_freq", moe_layer_freq}}) {
    if (p.value <= 0) return bad(absl::StrCat(p.name, " must be positive, got ", p.value));
  }
  if (q_lora_rank < 0) return bad("q_lora_rank must be null or positive");
  if (has_indexer()) {
    if (q_lora_rank <= 0) return bad("deepseek_v32 needs q_lora_rank: the indexer reads its latent");
    if (index_topk <= 0 || index_n_heads <= 0) return bad("index_topk and index_n_heads must be positive");
    if (index_head_dim < qk_rope_head_dim) {
      return bad(absl::StrCat("index_head_dim (", index_head_dim, ") must be at least qk_rope_head_dim (",
                              qk_rope_head_dim, ")"));
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
        return bad(absl::StrCat("topk_group (", topk_group, ") must lie in [1, n_group = ", n_group, "]"));
      }
      const int reachable = topk_group * (n_routed_experts / n_group);
      if (num_experts_per_tok > reachable) {
        return bad(absl::StrCat("num_experts_per_tok (", num_experts_per_tok, ") exceeds the ",
                                reachable, " experts in topk_group (", topk_group, ") groups"));
      }
      if (topk_method == TopkMethod::kNoauxTc && n_routed_experts / n_group < 2) {
        return bad("noaux_tc scores groups by their top-2 experts: n_routed_experts / n_group must be >= 2");
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
  for (int e : eos_token_ids) {
    if (e < 0 || e >= vocab_size) {
      return bad(absl::StrCat("eos_token_id ", e, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ModelConfig::ValidateV4(const std::string& source) const {
  auto bad = [&](const std::string& why) { return absl::InvalidArgumentError(absl::StrCat(source, ": ", why)); };
  struct Positive {
    const char* name;
    int value;
  };
  for (const Positive& p : {Positive{"vocab_size", vocab_size}, {"hidden_size", hidden_size},
                            {"num_hidden_layers", num_hidden_layers}, {"num_attention_heads", num_attention_heads},
                            {"head_dim", head_dim}, {"q_lora_rank", q_lora_rank}, {"o_groups", o_groups},
                            {"o_lora_rank", o_lora_rank}, {"sliding_window", sliding_window}, {"hc_mult", hc_mult},
                            {"hc_sinkhorn_iters", hc_sinkhorn_iters}, {"moe_intermediate_size", moe_intermediate_size},
                            {"n_routed_experts", n_routed_experts}, {"compress_rate_csa", compress_rate_csa},
                            {"compress_rate_hca", compress_rate_hca}}) {
    if (p.value <= 0) return bad(absl::StrCat(p.name, " must be positive, got ", p.value));
  }
  if (qk_rope_head_dim <= 0 || qk_rope_head_dim % 2 != 0 || qk_rope_head_dim > head_dim) {
    return bad(absl::StrCat("the rotated part of a head (", qk_rope_head_dim, ") must be even and within head_dim (",
                            head_dim, ")"));
  }
  if (num_attention_heads % o_groups != 0) {
    return bad(absl::StrCat("num_attention_heads (", num_attention_heads, ") must be divisible by o_groups (",
                            o_groups, ")"));
  }
  if (num_experts_per_tok <= 0 || num_experts_per_tok > n_routed_experts) {
    return bad(absl::StrCat("num_experts_per_tok (", num_experts_per_tok, ") must lie in [1, n_routed_experts = ",
                            n_routed_experts, "]"));
  }
  if (n_shared_experts < 0 || n_shared_experts > 1) return bad("n_shared_experts must be 0 or 1");
  for (V4AttentionType t : layer_types) {
    if (t != V4AttentionType::kCompressedSparse) continue;
    if (index_topk <= 0 || index_n_heads <= 0 || index_head_dim < qk_rope_head_dim) {
      return bad("compressed_sparse_attention layers need index_topk, index_n_heads and an index_head_dim of at "
                 "least the rotated dims");
    }
  }
  if (rope.theta <= 0 || compress_rope.theta <= 0) return bad("rope_theta and compress_rope_theta must be positive");
  if (compress_rope.type == RopeType::kYarn &&
      (compress_rope.factor <= 0 || compress_rope.original_max_position_embeddings <= 0)) {
    return bad("yarn rope needs a positive factor and original_max_position_embeddings");
  }
  for (int e : eos_token_ids) {
    if (e < 0 || e >= vocab_size) {
      return bad(absl::StrCat("eos_token_id ", e, " is outside the vocabulary [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

int ModelConfig::V4RowWidth(int l) const {
  switch (layer_types[l]) {
    case V4AttentionType::kSliding:
      return head_dim;
    case V4AttentionType::kHeavilyCompressed:
      return 3 * head_dim;
    case V4AttentionType::kCompressedSparse:
      return 5 * head_dim + 4 * index_head_dim;
  }
  return head_dim;
}

int ModelConfig::kv_cache_row_width() const {
  if (!is_v4()) return kv_lora_rank + qk_rope_head_dim + (has_indexer() ? index_head_dim : 0);
  int width = 0;
  for (int l = 0; l < num_hidden_layers; ++l) width = std::max(width, V4RowWidth(l));
  return width;
}

std::string ModelConfig::Fingerprint() const {
  return absl::StrCat(model_type, "/L", num_hidden_layers, "/H", hidden_size, "/E", n_routed_experts, "/V",
                      vocab_size);
}

namespace {

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

// V4 in transformers' spelling (what DeepseekV4Config.save_pretrained writes).
std::string V4ToJson(const ModelConfig& c) {
  Json j;
  j["model_type"] = "deepseek_v4";
  j["architectures"] = {"DeepseekV4ForCausalLM"};
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = c.head_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  j["o_groups"] = c.o_groups;
  j["o_lora_rank"] = c.o_lora_rank;
  j["moe_intermediate_size"] = c.moe_intermediate_size;
  j["n_routed_experts"] = c.n_routed_experts;
  j["n_shared_experts"] = c.n_shared_experts;
  j["num_experts_per_tok"] = c.num_experts_per_tok;
  j["scoring_func"] = c.scoring_func == ScoringFunc::kSqrtSoftplus ? "sqrtsoftplus"
                      : c.scoring_func == ScoringFunc::kSigmoid    ? "sigmoid"
                                                                   : "softmax";
  j["norm_topk_prob"] = true;
  j["routed_scaling_factor"] = c.routed_scaling_factor;
  j["swiglu_limit"] = c.swiglu_limit;
  j["sliding_window"] = c.sliding_window;
  j["hc_mult"] = c.hc_mult;
  j["hc_sinkhorn_iters"] = c.hc_sinkhorn_iters;
  j["hc_eps"] = c.hc_eps;
  j["index_topk"] = c.index_topk;
  j["index_head_dim"] = c.index_head_dim;
  j["index_n_heads"] = c.index_n_heads;
  Json types = Json::array(), mlp = Json::array();
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    types.push_back(c.layer_types[l] == V4AttentionType::kSliding            ? "sliding_attention"
                    : c.layer_types[l] == V4AttentionType::kCompressedSparse ? "compressed_sparse_attention"
                                                                             : "heavily_compressed_attention");
    mlp.push_back(c.hash_layers[l] ? "hash_moe" : "moe");
  }
  j["layer_types"] = types;
  j["mlp_layer_types"] = mlp;
  j["compress_rates"] = {{"compressed_sparse_attention", c.compress_rate_csa},
                         {"heavily_compressed_attention", c.compress_rate_hca}};
  const double partial = static_cast<double>(c.qk_rope_head_dim) / c.head_dim;
  j["partial_rotary_factor"] = partial;
  j["rope_theta"] = c.rope.theta;
  j["compress_rope_theta"] = c.compress_rope.theta;
  j["rope_parameters"] = {{"main", RopeJson(c.rope, partial)}, {"compress", RopeJson(c.compress_rope, partial)}};
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  j["torch_dtype"] = "bfloat16";
  return j.dump(2);
}

}  // namespace

std::string ModelConfig::ToJson(bool new_rope_form) const {
  if (is_v4()) return V4ToJson(*this);
  Json j;
  j["model_type"] = model_type;
  j["architectures"] = {family == ModelFamily::kDeepseekV2    ? "DeepseekV2ForCausalLM"
                        : family == ModelFamily::kDeepseekV32 ? "DeepseekV32ForCausalLM"
                                                              : "DeepseekV3ForCausalLM"};
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["moe_intermediate_size"] = moe_intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_attention_heads;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["q_lora_rank"] = q_lora_rank > 0 ? Json(q_lora_rank) : Json(nullptr);
  j["kv_lora_rank"] = kv_lora_rank;
  j["qk_nope_head_dim"] = qk_nope_head_dim;
  j["qk_rope_head_dim"] = qk_rope_head_dim;
  j["v_head_dim"] = v_head_dim;
  if (family == ModelFamily::kDeepseekV3) j["rope_interleave"] = rope_interleave;
  if (has_indexer()) {
    j["index_topk"] = index_topk;
    j["index_head_dim"] = index_head_dim;
    j["index_n_heads"] = index_n_heads;
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
