#include "common/model/weights.h"

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace moesh {
namespace {

constexpr int kFp8Block = 128;

std::string Layer(int l) { return absl::StrCat("model.layers.", l, "."); }

void AddMlp(std::vector<TensorSpec>* s, const std::string& prefix, int64_t inter, int64_t hidden) {
  s->push_back({prefix + "gate_proj.weight", {inter, hidden}});
  s->push_back({prefix + "up_proj.weight", {inter, hidden}});
  s->push_back({prefix + "down_proj.weight", {hidden, inter}});
}

std::string ShapeStr(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Layer index of "model.layers.N.…", or -1.
int LayerIndexOf(const std::string& name) {
  constexpr absl::string_view kPrefix = "model.layers.";
  if (!absl::StartsWith(name, kPrefix)) return -1;
  size_t end = name.find('.', kPrefix.size());
  int l = -1;
  if (end == std::string::npos ||
      !absl::SimpleAtoi(name.substr(kPrefix.size(), end - kPrefix.size()), &l)) {
    return -1;
  }
  return l;
}

absl::StatusOr<MlpWeights> ReadMlp(const Checkpoint& ckpt, const std::string& prefix, int inter,
                                   int hidden) {
  return ReadMlpTensors(ckpt, prefix, inter, hidden, "gate_proj.weight", "up_proj.weight",
                        "down_proj.weight");
}

}  // namespace

absl::StatusOr<MlpWeights> ReadMlpTensors(const Checkpoint& ckpt, const std::string& prefix,
                                          int inter, int hidden, const std::string& gate_name,
                                          const std::string& up_name,
                                          const std::string& down_name) {
  MlpWeights m;
  m.intermediate = inter;
  ASSIGN_OR_RETURN(std::vector<float> gate,
                   ReadTensorF32(ckpt, prefix + gate_name, {inter, hidden}));
  ASSIGN_OR_RETURN(std::vector<float> up, ReadTensorF32(ckpt, prefix + up_name, {inter, hidden}));
  ASSIGN_OR_RETURN(m.down, ReadTensorF32(ckpt, prefix + down_name, {hidden, inter}));
  m.gate_up = std::move(gate);
  m.gate_up.insert(m.gate_up.end(), up.begin(), up.end());
  return m;
}

std::string ExpertPrefix(const ModelConfig& c, int layer, int expert) {
  return absl::StrCat(Layer(layer), c.layers() == LayerArch::kV4 ? "ffn" : "mlp", ".experts.",
                      expert, ".");
}

std::vector<TensorSpec> CheckpointSchema(const ModelConfig& c) {
  if (c.layers() == LayerArch::kV4) return V4CheckpointSchema(c);
  std::vector<TensorSpec> s;
  const int64_t h = c.hidden_size;
  const int64_t heads = c.num_attention_heads;
  s.push_back({"model.embed_tokens.weight", {c.vocab_size, h}});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = Layer(l);
    s.push_back({p + "input_layernorm.weight", {h}});
    s.push_back({p + "post_attention_layernorm.weight", {h}});
    if (c.q_lora_rank > 0) {
      s.push_back({p + "self_attn.q_a_proj.weight", {c.q_lora_rank, h}});
      s.push_back({p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank}});
      s.push_back({p + "self_attn.q_b_proj.weight", {heads * c.qk_head_dim(), c.q_lora_rank}});
    } else {
      s.push_back({p + "self_attn.q_proj.weight", {heads * c.qk_head_dim(), h}});
    }
    s.push_back(
        {p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, h}});
    s.push_back({p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}});
    s.push_back({p + "self_attn.kv_b_proj.weight",
                 {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}});
    s.push_back({p + "self_attn.o_proj.weight", {h, heads * c.v_head_dim}});
    if (c.has_indexer()) {
      s.push_back({p + "self_attn.indexer.wq_b.weight",
                   {static_cast<int64_t>(c.indexer.n_heads) * c.indexer.head_dim, c.q_lora_rank}});
      s.push_back({p + "self_attn.indexer.wk.weight", {c.indexer.head_dim, h}});
      s.push_back({p + "self_attn.indexer.k_norm.weight", {c.indexer.head_dim}});
      s.push_back({p + "self_attn.indexer.k_norm.bias", {c.indexer.head_dim}});
      s.push_back({p + "self_attn.indexer.weights_proj.weight", {c.indexer.n_heads, h}});
    }
    if (!c.IsMoeLayer(l)) {
      AddMlp(&s, p + "mlp.", c.intermediate_size, h);
      continue;
    }
    s.push_back({p + "mlp.gate.weight", {c.n_routed_experts, h}});
    if (c.topk_method == TopkMethod::kNoauxTc) {
      s.push_back({p + "mlp.gate.e_score_correction_bias", {c.n_routed_experts}});
    }
    for (int e = 0; e < c.n_routed_experts; ++e) {
      AddMlp(&s, absl::StrCat(p, "mlp.experts.", e, "."), c.moe_intermediate_size, h);
    }
    if (c.n_shared_experts > 0) {
      AddMlp(&s, p + "mlp.shared_experts.",
             static_cast<int64_t>(c.moe_intermediate_size) * c.n_shared_experts, h);
    }
  }
  s.push_back({"model.norm.weight", {h}});
  if (!c.tie_word_embeddings) s.push_back({"lm_head.weight", {c.vocab_size, h}});
  return s;
}

absl::Status ValidateCheckpoint(const ModelConfig& c, const Checkpoint& ckpt) {
  std::set<std::string> expected;
  for (const TensorSpec& spec : CheckpointSchema(c)) {
    expected.insert(spec.name);
    auto t = ckpt.tensors().find(spec.name);
    if (t == ckpt.tensors().end()) {
      return absl::InvalidArgumentError(absl::StrCat(ckpt.dir(), ": tensor \"", spec.name,
                                                     "\" (shape ", ShapeStr(spec.shape),
                                                     ") is missing from the checkpoint"));
    }
    const TensorView& v = *t->second;
    if (v.shape != spec.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(v.file, ": tensor \"", spec.name, "\" has shape ", v.ShapeString(),
                       " but config.json implies ", ShapeStr(spec.shape)));
    }
    if (spec.integer) {
      if (v.dtype != DType::kI64 && v.dtype != DType::kI32) {
        return absl::InvalidArgumentError(
            absl::StrCat(v.file, ": tensor \"", spec.name, "\" has dtype ",
                         std::string(DTypeName(v.dtype)), "; it must be I64 or I32"));
      }
      continue;
    }
    switch (v.dtype) {
      case DType::kF32:
      case DType::kBF16:
      case DType::kF16:
        break;
      case DType::kF8E4M3: {
        const std::string scale_name = spec.name + "_scale_inv";
        auto s = ckpt.tensors().find(scale_name);
        const std::vector<int64_t> want = {
            (spec.shape[0] + kFp8Block - 1) / kFp8Block,
            spec.shape.size() > 1 ? (spec.shape[1] + kFp8Block - 1) / kFp8Block : 1};
        if (spec.shape.size() != 2 || s == ckpt.tensors().end() || s->second->shape != want ||
            s->second->dtype == DType::kF8E4M3) {
          return absl::InvalidArgumentError(
              absl::StrCat(v.file, ": F8_E4M3 tensor \"", spec.name, "\" needs a float \"",
                           scale_name, "\" of shape ", ShapeStr(want), " (128x128 blocks)"));
        }
        expected.insert(scale_name);
        break;
      }
      case DType::kI64:
      case DType::kI32:
        return absl::InvalidArgumentError(absl::StrCat(
            v.file, ": tensor \"", spec.name, "\" has dtype ", std::string(DTypeName(v.dtype)),
            "; weights must be F32, BF16, F16 or F8_E4M3"));
    }
  }
  std::vector<std::string> extra;
  for (const auto& [name, view] : ckpt.tensors()) {
    if (expected.count(name)) continue;
    if (LayerIndexOf(name) >= c.num_hidden_layers) continue;  // MTP layers
    if (c.tie_word_embeddings && name == "lm_head.weight") continue;
    if (absl::EndsWith(name, "rotary_emb.inv_freq")) continue;  // old transformers buffers
    if (absl::StartsWith(name, "mtp.")) continue;               // V4's MTP block
    extra.push_back(absl::StrCat("\"", name, "\" in ", view->file));
  }
  if (!extra.empty()) {
    if (extra.size() > 5) {
      const size_t more = extra.size() - 5;
      extra.resize(5);
      extra.push_back(absl::StrCat("and ", more, " more"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(ckpt.dir(), ": checkpoint has tensors that config.json does not account for: ",
                     absl::StrJoin(extra, ", ")));
  }
  return absl::OkStatus();
}

namespace {

// Checkpoint tensor `name`; INVALID_ARGUMENT naming it unless it has `shape`.
absl::StatusOr<const TensorView*> GetShaped(const Checkpoint& ckpt, const std::string& name,
                                            const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(const TensorView* v, ckpt.Get(name));
  if (v->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(v->file, ": tensor \"", name, "\" has shape ",
                                                   v->ShapeString(), ", expected ",
                                                   ShapeStr(shape)));
  }
  return v;
}

}  // namespace

absl::StatusOr<std::vector<float>> ReadTensorF32(const Checkpoint& ckpt, const std::string& name,
                                                 const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(const TensorView* v, GetShaped(ckpt, name, shape));
  std::vector<float> out(v->numel());
  if (v->dtype == DType::kI64 || v->dtype == DType::kI32) {
    return absl::InvalidArgumentError(
        absl::StrCat(v->file, ": tensor \"", name, "\" is an integer tensor, expected floats"));
  }
  ConvertToF32(v->dtype, v->data, out.size(), out.data());
  if (v->dtype == DType::kF8E4M3) {
    const int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
    const int64_t bcols = (cols + kFp8Block - 1) / kFp8Block;
    ASSIGN_OR_RETURN(
        std::vector<float> scale,
        ReadTensorF32(ckpt, name + "_scale_inv", {(rows + kFp8Block - 1) / kFp8Block, bcols}));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t col = 0; col < cols; ++col) {
        out[r * cols + col] *= scale[(r / kFp8Block) * bcols + col / kFp8Block];
      }
    }
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> ReadTensorI32(const Checkpoint& ckpt, const std::string& name,
                                                   const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(const TensorView* v, GetShaped(ckpt, name, shape));
  std::vector<int32_t> out(v->numel());
  if (v->dtype == DType::kI64) {
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t x;
      std::memcpy(&x, v->data + i * sizeof(int64_t), sizeof(x));
      out[i] = static_cast<int32_t>(x);
    }
  } else if (v->dtype == DType::kI32) {
    std::memcpy(out.data(), v->data, out.size() * sizeof(int32_t));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(v->file, ": tensor \"", name, "\" must be an integer tensor (I64 or I32)"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<AttentionWeights>> AttentionWeights::Load(const ModelConfig& c,
                                                                         const Checkpoint& ckpt) {
  auto w = std::make_unique<AttentionWeights>();
  if (c.layers() == LayerArch::kV4) {
    RETURN_IF_ERROR(LoadV4AttentionWeights(c, ckpt, w.get()));
    return w;
  }
  const int64_t h = c.hidden_size, heads = c.num_attention_heads;
  ASSIGN_OR_RETURN(w->embed_tokens,
                   ReadTensorF32(ckpt, "model.embed_tokens.weight", {c.vocab_size, h}));
  w->layers.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    AttentionLayerWeights& lw = w->layers[l];
    const std::string p = Layer(l);
    ASSIGN_OR_RETURN(lw.input_layernorm, ReadTensorF32(ckpt, p + "input_layernorm.weight", {h}));
    ASSIGN_OR_RETURN(lw.post_attention_layernorm,
                     ReadTensorF32(ckpt, p + "post_attention_layernorm.weight", {h}));
    if (c.q_lora_rank > 0) {
      ASSIGN_OR_RETURN(lw.q_a_proj,
                       ReadTensorF32(ckpt, p + "self_attn.q_a_proj.weight", {c.q_lora_rank, h}));
      ASSIGN_OR_RETURN(lw.q_a_layernorm,
                       ReadTensorF32(ckpt, p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank}));
      ASSIGN_OR_RETURN(lw.q_b_proj, ReadTensorF32(ckpt, p + "self_attn.q_b_proj.weight",
                                                  {heads * c.qk_head_dim(), c.q_lora_rank}));
    } else {
      ASSIGN_OR_RETURN(lw.q_proj, ReadTensorF32(ckpt, p + "self_attn.q_proj.weight",
                                                {heads * c.qk_head_dim(), h}));
    }
    ASSIGN_OR_RETURN(lw.kv_a_proj, ReadTensorF32(ckpt, p + "self_attn.kv_a_proj_with_mqa.weight",
                                                 {c.kv_lora_rank + c.qk_rope_head_dim, h}));
    ASSIGN_OR_RETURN(lw.kv_a_layernorm,
                     ReadTensorF32(ckpt, p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}));
    ASSIGN_OR_RETURN(lw.kv_b_proj,
                     ReadTensorF32(ckpt, p + "self_attn.kv_b_proj.weight",
                                   {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}));
    ASSIGN_OR_RETURN(lw.o_proj,
                     ReadTensorF32(ckpt, p + "self_attn.o_proj.weight", {h, heads * c.v_head_dim}));
    if (c.has_indexer()) {
      const int64_t d = c.indexer.head_dim;
      ASSIGN_OR_RETURN(lw.indexer_wq_b, ReadTensorF32(ckpt, p + "self_attn.indexer.wq_b.weight",
                                                      {c.indexer.n_heads * d, c.q_lora_rank}));
      ASSIGN_OR_RETURN(lw.indexer_wk,
                       ReadTensorF32(ckpt, p + "self_attn.indexer.wk.weight", {d, h}));
      ASSIGN_OR_RETURN(lw.indexer_k_norm,
                       ReadTensorF32(ckpt, p + "self_attn.indexer.k_norm.weight", {d}));
      ASSIGN_OR_RETURN(lw.indexer_k_norm_bias,
                       ReadTensorF32(ckpt, p + "self_attn.indexer.k_norm.bias", {d}));
      ASSIGN_OR_RETURN(
          lw.indexer_weights_proj,
          ReadTensorF32(ckpt, p + "self_attn.indexer.weights_proj.weight", {c.indexer.n_heads, h}));
    }
    lw.is_moe = c.IsMoeLayer(l);
    if (!lw.is_moe) {
      ASSIGN_OR_RETURN(lw.dense_mlp, ReadMlp(ckpt, p + "mlp.", c.intermediate_size, h));
      continue;
    }
    ASSIGN_OR_RETURN(lw.gate, ReadTensorF32(ckpt, p + "mlp.gate.weight", {c.n_routed_experts, h}));
    if (c.topk_method == TopkMethod::kNoauxTc) {
      ASSIGN_OR_RETURN(lw.gate_bias, ReadTensorF32(ckpt, p + "mlp.gate.e_score_correction_bias",
                                                   {c.n_routed_experts}));
    }
    if (c.n_shared_experts > 0) {
      ASSIGN_OR_RETURN(lw.shared_experts, ReadMlp(ckpt, p + "mlp.shared_experts.",
                                                  c.moe_intermediate_size * c.n_shared_experts, h));
    }
  }
  ASSIGN_OR_RETURN(w->norm, ReadTensorF32(ckpt, "model.norm.weight", {h}));
  if (!c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(w->lm_head, ReadTensorF32(ckpt, "lm_head.weight", {c.vocab_size, h}));
  }
  return w;
}

namespace {

// `ids`, or every routed expert if empty; INVALID_ARGUMENT for ids out of range.
absl::StatusOr<std::set<int>> ShardExperts(const ModelConfig& c, std::set<int> ids) {
  if (ids.empty()) {
    for (int e = 0; e < c.n_routed_experts; ++e) ids.insert(e);
  }
  for (int e : ids) {
    if (e < 0 || e >= c.n_routed_experts) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expert id ", e, " is outside [0, n_routed_experts = ", c.n_routed_experts, ")"));
    }
  }
  return ids;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExpertShardWeights>> ExpertShardWeights::Placeholder(
    const ModelConfig& c, std::set<int> expert_ids) {
  auto w = std::make_unique<ExpertShardWeights>();
  ASSIGN_OR_RETURN(w->expert_ids, ShardExperts(c, std::move(expert_ids)));
  expert_ids = w->expert_ids;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.IsMoeLayer(l)) continue;
    for (int e : expert_ids) w->layers[l][e] = MlpWeights{};
  }
  return w;
}

bool ExpertShardWeights::is_placeholder() const {
  for (const auto& [l, experts] : layers) {
    for (const auto& [e, m] : experts) {
      if (!m.gate_up.empty()) return false;
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<ExpertShardWeights>> ExpertShardWeights::Load(
    const ModelConfig& c, const Checkpoint& ckpt, std::set<int> expert_ids) {
  auto w = std::make_unique<ExpertShardWeights>();
  ASSIGN_OR_RETURN(w->expert_ids, ShardExperts(c, std::move(expert_ids)));
  expert_ids = w->expert_ids;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.IsMoeLayer(l)) continue;
    for (int e : expert_ids) {
      if (c.layers() == LayerArch::kV4) {
        ASSIGN_OR_RETURN(w->layers[l][e],
                         ReadMlpTensors(ckpt, ExpertPrefix(c, l, e), c.moe_intermediate_size,
                                        c.hidden_size, "w1.weight", "w3.weight", "w2.weight"));
      } else {
        ASSIGN_OR_RETURN(w->layers[l][e], ReadMlp(ckpt, ExpertPrefix(c, l, e),
                                                  c.moe_intermediate_size, c.hidden_size));
      }
    }
  }
  return w;
}

}  // namespace moesh
