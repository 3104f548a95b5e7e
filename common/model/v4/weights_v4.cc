// DeepSeek-V4 checkpoints: the tensor names transformers' save_pretrained
// writes for DeepseekV4ForCausalLM (DeepSeek's own names inside each layer,
// transformers' for the embedding and final norm).
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/model/weights.h"

namespace moesh {
namespace {

std::string Layer(int l) { return absl::StrCat("model.layers.", l, "."); }

int64_t Mix(const ModelConfig& c) { return static_cast<int64_t>(2 + c.v4.hc_mult) * c.v4.hc_mult; }

void AddCompressor(std::vector<TensorSpec>* s, const std::string& p, int64_t series, int64_t d,
                   int64_t rate, int64_t hidden) {
  s->push_back({p + "wkv.weight", {series * d, hidden}});
  s->push_back({p + "wgate.weight", {series * d, hidden}});
  s->push_back({p + "ape", {rate, series * d}});
  s->push_back({p + "norm.weight", {d}});
}

absl::StatusOr<V4CompressorWeights> ReadCompressor(const Checkpoint& ckpt, const std::string& p,
                                                   int64_t series, int64_t d, int64_t rate,
                                                   int64_t hidden) {
  V4CompressorWeights w;
  ASSIGN_OR_RETURN(w.wkv, ReadTensorF32(ckpt, p + "wkv.weight", {series * d, hidden}));
  ASSIGN_OR_RETURN(w.wgate, ReadTensorF32(ckpt, p + "wgate.weight", {series * d, hidden}));
  ASSIGN_OR_RETURN(w.ape, ReadTensorF32(ckpt, p + "ape", {rate, series * d}));
  ASSIGN_OR_RETURN(w.norm, ReadTensorF32(ckpt, p + "norm.weight", {d}));
  return w;
}

}  // namespace

std::vector<TensorSpec> V4CheckpointSchema(const ModelConfig& c) {
  std::vector<TensorSpec> s;
  const int64_t h = c.hidden_size, heads = c.num_attention_heads, d = c.v4.head_dim;
  const int64_t hc_dim = static_cast<int64_t>(c.v4.hc_mult) * h;
  s.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = Layer(l);
    s.push_back({p + "attn_norm.weight", {h}});
    s.push_back({p + "ffn_norm.weight", {h}});
    for (const char* site : {"attn", "ffn"}) {
      s.push_back({absl::StrCat(p, "hc_", site, "_fn"), {Mix(c), hc_dim}});
      s.push_back({absl::StrCat(p, "hc_", site, "_base"), {Mix(c)}});
      s.push_back({absl::StrCat(p, "hc_", site, "_scale"), {3}});
    }
    const std::string a = p + "attn.";
    s.push_back({a + "wq_a.weight", {c.q_lora_rank, h}});
    s.push_back({a + "q_norm.weight", {c.q_lora_rank}});
    s.push_back({a + "wq_b.weight", {heads * d, c.q_lora_rank}});
    s.push_back({a + "wkv.weight", {d, h}});
    s.push_back({a + "norm.weight", {d}});
    s.push_back(
        {a + "wo_a.weight",
         {static_cast<int64_t>(c.v4.o_groups) * c.v4.o_lora_rank, heads * d / c.v4.o_groups}});
    s.push_back({a + "wo_b.weight", {h, static_cast<int64_t>(c.v4.o_groups) * c.v4.o_lora_rank}});
    s.push_back({a + "attn_sink", {heads}});
    if (c.v4.layer_types[l] == V4AttentionType::kCompressedSparse) {
      const int64_t di = c.indexer.head_dim;
      AddCompressor(&s, a + "compressor.", 2, d, c.v4.compress_rate_csa, h);
      AddCompressor(&s, a + "indexer.compressor.", 2, di, c.v4.compress_rate_csa, h);
      s.push_back({a + "indexer.wq_b.weight",
                   {static_cast<int64_t>(c.indexer.n_heads) * di, c.q_lora_rank}});
      s.push_back({a + "indexer.weights_proj.weight", {c.indexer.n_heads, h}});
    } else if (c.v4.layer_types[l] == V4AttentionType::kHeavilyCompressed) {
      AddCompressor(&s, a + "compressor.", 1, d, c.v4.compress_rate_hca, h);
    }
    const std::string f = p + "ffn.";
    s.push_back({f + "gate.weight", {c.n_routed_experts, h}});
    if (c.v4.hash_layers[l]) {
      TensorSpec table{f + "gate.tid2eid", {c.vocab_size, c.num_experts_per_tok}};
      table.integer = true;
      s.push_back(table);
    } else {
      s.push_back({f + "gate.bias", {c.n_routed_experts}});
    }
    for (int e = 0; e < c.n_routed_experts; ++e) {
      const std::string x = ExpertPrefix(c, l, e);
      s.push_back({x + "w1.weight", {c.moe_intermediate_size, h}});
      s.push_back({x + "w2.weight", {h, c.moe_intermediate_size}});
      s.push_back({x + "w3.weight", {c.moe_intermediate_size, h}});
    }
    if (c.n_shared_experts > 0) {
      s.push_back({f + "shared_experts.w1.weight", {c.moe_intermediate_size, h}});
      s.push_back({f + "shared_experts.w2.weight", {h, c.moe_intermediate_size}});
      s.push_back({f + "shared_experts.w3.weight", {c.moe_intermediate_size, h}});
    }
  }
  s.push_back({"model.hc_head.hc_fn", {c.v4.hc_mult, hc_dim}});
  s.push_back({"model.hc_head.hc_base", {c.v4.hc_mult}});
  s.push_back({"model.hc_head.hc_scale", {1}});
  s.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) s.push_back({"head.weight", {c.vocab_size, h}});
  return s;
}

absl::Status LoadV4AttentionWeights(const ModelConfig& c, const Checkpoint& ckpt,
                                    AttentionWeights* w) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads, d = c.v4.head_dim;
  const int64_t hc_dim = static_cast<int64_t>(c.v4.hc_mult) * h;
  ASSIGN_OR_RETURN(w->embed_tokens,
                   ReadTensorF32(ckpt, "model.embed_tokens.weight", {c.vocab_size, h}));
  w->layers.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    AttentionLayerWeights& lw = w->layers[l];
    V4LayerWeights& v = lw.v4;
    const std::string p = Layer(l);
    ASSIGN_OR_RETURN(lw.input_layernorm, ReadTensorF32(ckpt, p + "attn_norm.weight", {h}));
    ASSIGN_OR_RETURN(lw.post_attention_layernorm, ReadTensorF32(ckpt, p + "ffn_norm.weight", {h}));
    ASSIGN_OR_RETURN(v.hc_attn_fn, ReadTensorF32(ckpt, p + "hc_attn_fn", {Mix(c), hc_dim}));
    ASSIGN_OR_RETURN(v.hc_attn_base, ReadTensorF32(ckpt, p + "hc_attn_base", {Mix(c)}));
    ASSIGN_OR_RETURN(v.hc_attn_scale, ReadTensorF32(ckpt, p + "hc_attn_scale", {3}));
    ASSIGN_OR_RETURN(v.hc_ffn_fn, ReadTensorF32(ckpt, p + "hc_ffn_fn", {Mix(c), hc_dim}));
    ASSIGN_OR_RETURN(v.hc_ffn_base, ReadTensorF32(ckpt, p + "hc_ffn_base", {Mix(c)}));
    ASSIGN_OR_RETURN(v.hc_ffn_scale, ReadTensorF32(ckpt, p + "hc_ffn_scale", {3}));
    const std::string a = p + "attn.";
    ASSIGN_OR_RETURN(v.wq_a, ReadTensorF32(ckpt, a + "wq_a.weight", {c.q_lora_rank, h}));
    ASSIGN_OR_RETURN(v.q_norm, ReadTensorF32(ckpt, a + "q_norm.weight", {c.q_lora_rank}));
    ASSIGN_OR_RETURN(v.wq_b, ReadTensorF32(ckpt, a + "wq_b.weight", {heads * d, c.q_lora_rank}));
    ASSIGN_OR_RETURN(v.wkv, ReadTensorF32(ckpt, a + "wkv.weight", {d, h}));
    ASSIGN_OR_RETURN(v.kv_norm, ReadTensorF32(ckpt, a + "norm.weight", {d}));
    ASSIGN_OR_RETURN(v.wo_a, ReadTensorF32(ckpt, a + "wo_a.weight",
                                           {static_cast<int64_t>(c.v4.o_groups) * c.v4.o_lora_rank,
                                            heads * d / c.v4.o_groups}));
    ASSIGN_OR_RETURN(v.wo_b,
                     ReadTensorF32(ckpt, a + "wo_b.weight",
                                   {h, static_cast<int64_t>(c.v4.o_groups) * c.v4.o_lora_rank}));
    ASSIGN_OR_RETURN(v.sinks, ReadTensorF32(ckpt, a + "attn_sink", {heads}));
    if (c.v4.layer_types[l] == V4AttentionType::kCompressedSparse) {
      const int64_t di = c.indexer.head_dim;
      ASSIGN_OR_RETURN(v.compressor,
                       ReadCompressor(ckpt, a + "compressor.", 2, d, c.v4.compress_rate_csa, h));
      ASSIGN_OR_RETURN(v.index_compressor, ReadCompressor(ckpt, a + "indexer.compressor.", 2, di,
                                                          c.v4.compress_rate_csa, h));
      ASSIGN_OR_RETURN(v.index_wq_b, ReadTensorF32(ckpt, a + "indexer.wq_b.weight",
                                                   {static_cast<int64_t>(c.indexer.n_heads) * di,
                                                    c.q_lora_rank}));
      ASSIGN_OR_RETURN(v.index_weights_proj, ReadTensorF32(ckpt, a + "indexer.weights_proj.weight",
                                                           {c.indexer.n_heads, h}));
    } else if (c.v4.layer_types[l] == V4AttentionType::kHeavilyCompressed) {
      ASSIGN_OR_RETURN(v.compressor,
                       ReadCompressor(ckpt, a + "compressor.", 1, d, c.v4.compress_rate_hca, h));
    }
    const std::string f = p + "ffn.";
    lw.is_moe = true;
    ASSIGN_OR_RETURN(lw.gate, ReadTensorF32(ckpt, f + "gate.weight", {c.n_routed_experts, h}));
    if (c.v4.hash_layers[l]) {
      ASSIGN_OR_RETURN(v.tid2eid, ReadTensorI32(ckpt, f + "gate.tid2eid",
                                                {c.vocab_size, c.num_experts_per_tok}));
      for (int32_t e : v.tid2eid) {
        if (e < 0 || e >= c.n_routed_experts) {
          return absl::InvalidArgumentError(
              absl::StrCat(ckpt.dir(), ": ", f, "gate.tid2eid holds expert ", e, ", outside [0, ",
                           c.n_routed_experts, ")"));
        }
      }
    } else {
      ASSIGN_OR_RETURN(lw.gate_bias, ReadTensorF32(ckpt, f + "gate.bias", {c.n_routed_experts}));
    }
    if (c.n_shared_experts > 0) {
      ASSIGN_OR_RETURN(lw.shared_experts,
                       ReadMlpTensors(ckpt, f + "shared_experts.", c.moe_intermediate_size, h,
                                      "w1.weight", "w3.weight", "w2.weight"));
    }
  }
  ASSIGN_OR_RETURN(w->hc_head_fn,
                   ReadTensorF32(ckpt, "model.hc_head.hc_fn", {c.v4.hc_mult, hc_dim}));
  ASSIGN_OR_RETURN(w->hc_head_base, ReadTensorF32(ckpt, "model.hc_head.hc_base", {c.v4.hc_mult}));
  ASSIGN_OR_RETURN(w->hc_head_scale, ReadTensorF32(ckpt, "model.hc_head.hc_scale", {1}));
  ASSIGN_OR_RETURN(w->norm, ReadTensorF32(ckpt, "model.norm.weight", {h}));
  if (!c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(w->lm_head, ReadTensorF32(ckpt, "head.weight", {c.vocab_size, h}));
  }
  return absl::OkStatus();
}

}  // namespace moesh
