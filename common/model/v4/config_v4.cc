#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/model/config.h"
#include "common/model/config_json.h"

// DeepSeek-V4's part of ModelConfig: parsing, validation, the cache row, and
// the config.json it writes.
namespace moesh {
namespace config_internal {

// DeepSeek-V4's fields, in transformers' spelling (layer_types, mlp_layer_types,
// compress_rates, partial_rotary_factor, rope_parameters {main, compress}) or
// DeepSeek's own (compress_ratios, num_hash_layers, qk_rope_head_dim,
// rope_theta + compress_rope_theta + rope_scaling), with transformers' defaults.
absl::Status ParseV4(const Json& j, const std::string& source, ModelConfig* c) {
  FieldReader r(j, source);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", why));
  };
  RETURN_IF_ERROR(r.Int("vocab_size", &c->vocab_size, true));
  RETURN_IF_ERROR(r.Int("hidden_size", &c->hidden_size, true));
  RETURN_IF_ERROR(r.Int("num_hidden_layers", &c->num_hidden_layers, true));
  RETURN_IF_ERROR(r.Int("num_attention_heads", &c->num_attention_heads, true));
  RETURN_IF_ERROR(r.Int("head_dim", &c->v4.head_dim, true));
  RETURN_IF_ERROR(r.Int("q_lora_rank", &c->q_lora_rank, true));
  RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c->moe_intermediate_size, true));
  RETURN_IF_ERROR(r.Int("n_routed_experts", &c->n_routed_experts, true));
  RETURN_IF_ERROR(r.Int("num_experts_per_tok", &c->num_experts_per_tok, true));
  RETURN_IF_ERROR(r.Int("o_groups", &c->v4.o_groups, true));
  RETURN_IF_ERROR(r.Int("o_lora_rank", &c->v4.o_lora_rank, true));
  RETURN_IF_ERROR(r.Int("sliding_window", &c->v4.sliding_window, true));
  RETURN_IF_ERROR(r.Int("hc_mult", &c->v4.hc_mult, true));
  c->n_shared_experts = 1;
  RETURN_IF_ERROR(r.Int("n_shared_experts", &c->n_shared_experts));
  c->v4.hc_sinkhorn_iters = 20;
  RETURN_IF_ERROR(r.Int("hc_sinkhorn_iters", &c->v4.hc_sinkhorn_iters));
  RETURN_IF_ERROR(r.Double("hc_eps", &c->v4.hc_eps));
  c->swiglu_limit = 10.0;
  RETURN_IF_ERROR(r.Double("swiglu_limit", &c->swiglu_limit));
  RETURN_IF_ERROR(r.Int("max_position_embeddings", &c->max_position_embeddings));
  RETURN_IF_ERROR(r.Double("rms_norm_eps", &c->rms_norm_eps));
  c->routed_scaling_factor = 1.5;
  RETURN_IF_ERROR(r.Double("routed_scaling_factor", &c->routed_scaling_factor));
  RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c->tie_word_embeddings));
  RETURN_IF_ERROR(r.Int("bos_token_id", &c->bos_token_id));
  RETURN_IF_ERROR(ParseEos(j, source, &c->eos_token_ids));
  RETURN_IF_ERROR(r.Int("index_topk", &c->indexer.topk));
  RETURN_IF_ERROR(r.Int("index_head_dim", &c->indexer.head_dim));
  RETURN_IF_ERROR(r.Int("index_n_heads", &c->indexer.n_heads));
  int kv_heads = 1;
  RETURN_IF_ERROR(r.Int("num_key_value_heads", &kv_heads));
  if (kv_heads != 1)
    return bad(absl::StrCat("num_key_value_heads must be 1 (shared-KV MQA), got ", kv_heads));
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
    return bad(absl::StrCat("scoring_func \"", scoring,
                            "\" is not supported (sqrtsoftplus, sigmoid, softmax)"));
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
    RETURN_IF_ERROR(rr.Int("compressed_sparse_attention", &c->v4.compress_rate_csa));
    RETURN_IF_ERROR(rr.Int("heavily_compressed_attention", &c->v4.compress_rate_hca));
  }
  RETURN_IF_ERROR(r.Int("compress_rate_csa", &c->v4.compress_rate_csa));
  RETURN_IF_ERROR(r.Int("compress_rate_hca", &c->v4.compress_rate_hca));
  c->v4.layer_types.clear();
  if (r.Has("layer_types")) {
    const Json& types = j["layer_types"];
    if (!types.is_array()) return bad("layer_types must be a list");
    for (const Json& t : types) {
      if (t == "sliding_attention") {
        c->v4.layer_types.push_back(V4AttentionType::kSliding);
      } else if (t == "compressed_sparse_attention") {
        c->v4.layer_types.push_back(V4AttentionType::kCompressedSparse);
      } else if (t == "heavily_compressed_attention") {
        c->v4.layer_types.push_back(V4AttentionType::kHeavilyCompressed);
      } else {
        return bad(absl::StrCat("layer_types entry ", t.dump(),
                                " is not one of sliding_attention, "
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
        c->v4.layer_types.push_back(V4AttentionType::kSliding);
      } else if (ratio == 4) {
        c->v4.layer_types.push_back(V4AttentionType::kCompressedSparse);
      } else if (ratio == 128) {
        c->v4.layer_types.push_back(V4AttentionType::kHeavilyCompressed);
      } else {
        return bad(absl::StrCat("compress_ratios entry ", x.dump(), " is not 0, 4 or 128"));
      }
    }
  } else {
    // transformers' default: two HCA layers, then CSA and HCA alternating.
    for (int l = 0; l < n; ++l) {
      c->v4.layer_types.push_back(l < 2 || l % 2 == 0 ? V4AttentionType::kHeavilyCompressed
                                                      : V4AttentionType::kCompressedSparse);
    }
  }
  if (static_cast<int>(c->v4.layer_types.size()) < n) {
    return bad(absl::StrCat("layer_types / compress_ratios list ", c->v4.layer_types.size(),
                            " layers, num_hidden_layers is ", n));
  }
  c->v4.layer_types.resize(n);  // an MTP layer's entry may follow

  c->v4.hash_layers.assign(n, false);
  if (r.Has("mlp_layer_types")) {
    const Json& types = j["mlp_layer_types"];
    if (!types.is_array() || static_cast<int>(types.size()) < n)
      return bad("mlp_layer_types must list every layer");
    for (int l = 0; l < n; ++l) {
      if (types[l] != "hash_moe" && types[l] != "moe") {
        return bad(absl::StrCat("mlp_layer_types[", l, "] must be \"hash_moe\" or \"moe\", got ",
                                types[l].dump()));
      }
      c->v4.hash_layers[l] = types[l] == "hash_moe";
    }
  } else {
    int num_hash = 3;  // transformers' default
    RETURN_IF_ERROR(r.Int("num_hash_layers", &num_hash));
    for (int l = 0; l < n && l < num_hash; ++l) c->v4.hash_layers[l] = true;
  }

  // Partial rope: the last qk_rope_head_dim dims of each head.
  double partial = 0.0;
  RETURN_IF_ERROR(r.Double("partial_rotary_factor", &partial));
  int legacy_rope_dim = 0;
  RETURN_IF_ERROR(r.Int("qk_rope_head_dim", &legacy_rope_dim));
  c->rope = RopeConfig();
  c->v4.compress_rope = RopeConfig();
  c->v4.compress_rope.theta = 160000.0;
  RETURN_IF_ERROR(r.Double("rope_theta", &c->rope.theta));
  RETURN_IF_ERROR(r.Double("compress_rope_theta", &c->v4.compress_rope.theta));
  if (r.Has("rope_parameters")) {
    const Json& rp = j["rope_parameters"];
    if (!rp.is_object()) return bad("rope_parameters must be an object");
    if (rp.contains("main") && rp.contains("compress")) {
      RETURN_IF_ERROR(ParseRope(rp["main"], source + " rope_parameters.main", &c->rope));
      RETURN_IF_ERROR(
          ParseRope(rp["compress"], source + " rope_parameters.compress", &c->v4.compress_rope));
      FieldReader cr(rp["compress"], source);
      if (partial == 0.0) RETURN_IF_ERROR(cr.Double("partial_rotary_factor", &partial));
    } else {
      // One flat set: the compressed layers' scaling (main stays plain).
      const double theta = c->v4.compress_rope.theta;
      RETURN_IF_ERROR(ParseRope(rp, source + " rope_parameters", &c->v4.compress_rope));
      c->v4.compress_rope.theta = theta;
    }
  } else if (r.Has("rope_scaling")) {
    if (!j["rope_scaling"].is_object()) return bad("rope_scaling must be an object");
    const double theta = c->v4.compress_rope.theta;
    RETURN_IF_ERROR(ParseRope(j["rope_scaling"], source + " rope_scaling", &c->v4.compress_rope));
    c->v4.compress_rope.theta = theta;
  }
  // The V4 reference leaves YaRN's magnitude scale out of cos and sin.
  if (c->v4.compress_rope.type == RopeType::kYarn && c->v4.compress_rope.attention_factor == 0.0) {
    c->v4.compress_rope.attention_factor = 1.0;
  }
  if (partial > 0.0) {
    c->qk_rope_head_dim = static_cast<int>(c->v4.head_dim * partial);
  } else if (legacy_rope_dim > 0) {
    c->qk_rope_head_dim = legacy_rope_dim;
  } else {
    c->qk_rope_head_dim = c->v4.head_dim / 8;  // transformers' default factor 64 / 512
  }
  return absl::OkStatus();
}

// V4 in transformers' spelling (what DeepseekV4Config.save_pretrained writes).
std::string V4ToJson(const ModelConfig& c) {
  Json j;
  j["model_type"] = std::string(c.traits().model_type);
  j["architectures"] = {std::string(c.traits().architecture)};
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = 1;
  j["head_dim"] = c.v4.head_dim;
  j["q_lora_rank"] = c.q_lora_rank;
  j["o_groups"] = c.v4.o_groups;
  j["o_lora_rank"] = c.v4.o_lora_rank;
  if (c.fp8_block_weights) {  // as DeepSeek-V4-Flash's config.json has it
    j["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"scale_fmt", "ue8m0"},
                                {"weight_block_size", {128, 128}},
                                {"activation_scheme", "dynamic"}};
    j["expert_dtype"] = c.mxfp4_experts ? "fp4" : "fp8";
  }
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
  j["sliding_window"] = c.v4.sliding_window;
  j["hc_mult"] = c.v4.hc_mult;
  j["hc_sinkhorn_iters"] = c.v4.hc_sinkhorn_iters;
  j["hc_eps"] = c.v4.hc_eps;
  j["index_topk"] = c.indexer.topk;
  j["index_head_dim"] = c.indexer.head_dim;
  j["index_n_heads"] = c.indexer.n_heads;
  Json types = Json::array(), mlp = Json::array();
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    types.push_back(c.v4.layer_types[l] == V4AttentionType::kSliding ? "sliding_attention"
                    : c.v4.layer_types[l] == V4AttentionType::kCompressedSparse
                        ? "compressed_sparse_attention"
                        : "heavily_compressed_attention");
    mlp.push_back(c.v4.hash_layers[l] ? "hash_moe" : "moe");
  }
  j["layer_types"] = types;
  j["mlp_layer_types"] = mlp;
  j["compress_rates"] = {{"compressed_sparse_attention", c.v4.compress_rate_csa},
                         {"heavily_compressed_attention", c.v4.compress_rate_hca}};
  const double partial = static_cast<double>(c.qk_rope_head_dim) / c.v4.head_dim;
  j["partial_rotary_factor"] = partial;
  j["rope_theta"] = c.rope.theta;
  j["compress_rope_theta"] = c.v4.compress_rope.theta;
  j["rope_parameters"] = {{"main", RopeJson(c.rope, partial)},
                          {"compress", RopeJson(c.v4.compress_rope, partial)}};
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

}  // namespace config_internal

absl::Status ModelConfig::ValidateV4(const std::string& source) const {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", why));
  };
  RETURN_IF_ERROR(
      config_internal::CheckPositive(source, {{"head_dim", v4.head_dim},
                                              {"q_lora_rank", q_lora_rank},
                                              {"o_groups", v4.o_groups},
                                              {"o_lora_rank", v4.o_lora_rank},
                                              {"sliding_window", v4.sliding_window},
                                              {"hc_mult", v4.hc_mult},
                                              {"hc_sinkhorn_iters", v4.hc_sinkhorn_iters},
                                              {"moe_intermediate_size", moe_intermediate_size},
                                              {"n_routed_experts", n_routed_experts},
                                              {"compress_rate_csa", v4.compress_rate_csa},
                                              {"compress_rate_hca", v4.compress_rate_hca}}));
  if (qk_rope_head_dim <= 0 || qk_rope_head_dim % 2 != 0 || qk_rope_head_dim > v4.head_dim) {
    return bad(absl::StrCat("the rotated part of a head (", qk_rope_head_dim,
                            ") must be even and within head_dim (", v4.head_dim, ")"));
  }
  if (num_attention_heads % v4.o_groups != 0) {
    return bad(absl::StrCat("num_attention_heads (", num_attention_heads,
                            ") must be divisible by o_groups (", v4.o_groups, ")"));
  }
  if (num_experts_per_tok <= 0 || num_experts_per_tok > n_routed_experts) {
    return bad(absl::StrCat("num_experts_per_tok (", num_experts_per_tok,
                            ") must lie in [1, n_routed_experts = ", n_routed_experts, "]"));
  }
  if (n_shared_experts < 0 || n_shared_experts > 1) return bad("n_shared_experts must be 0 or 1");
  for (V4AttentionType t : v4.layer_types) {
    if (t != V4AttentionType::kCompressedSparse) continue;
    if (indexer.topk <= 0 || indexer.n_heads <= 0 || indexer.head_dim < qk_rope_head_dim) {
      return bad(
          "compressed_sparse_attention layers need index_topk, index_n_heads and an index_head_dim "
          "of at least the rotated dims");
    }
  }
  if (rope.theta <= 0 || v4.compress_rope.theta <= 0)
    return bad("rope_theta and compress_rope_theta must be positive");
  if (v4.compress_rope.type == RopeType::kYarn &&
      (v4.compress_rope.factor <= 0 || v4.compress_rope.original_max_position_embeddings <= 0)) {
    return bad("yarn rope needs a positive factor and original_max_position_embeddings");
  }
  return absl::OkStatus();
}

int ModelConfig::V4RowWidth(int l) const {
  switch (v4.layer_types[l]) {
    case V4AttentionType::kSliding:
      return v4.head_dim;
    case V4AttentionType::kHeavilyCompressed:
      return 3 * v4.head_dim;
    case V4AttentionType::kCompressedSparse:
      return 5 * v4.head_dim + 4 * indexer.head_dim;
  }
  return v4.head_dim;
}

}  // namespace moesh
