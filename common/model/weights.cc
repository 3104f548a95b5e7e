#include "common/model/weights.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/dtype.h"
#include "base/status.h"
#include "kernels/cpu/mxfp4.h"

namespace moesh {
namespace {

constexpr int kFp8Block = 128;

std::string Layer(int l) { return absl::StrCat("model.layers.", l, "."); }

// A SwiGLU MLP's three tensors: DeepSeek's gate/up/down_proj (V4's experts:
// w1/w3/w2).
struct MlpTensorNames {
  std::string gate, up, down;
};
MlpTensorNames DeepSeekMlpNames(const std::string& prefix) {
  return {prefix + "gate_proj.weight", prefix + "up_proj.weight", prefix + "down_proj.weight"};
}

void AddMlp(std::vector<TensorSpec>* s, const std::string& prefix, int64_t inter, int64_t hidden) {
  const MlpTensorNames n = DeepSeekMlpNames(prefix);
  s->push_back({n.gate, {inter, hidden}});
  s->push_back({n.up, {inter, hidden}});
  s->push_back({n.down, {hidden, inter}});
}

// The MLP `n` ([inter, hidden] gate and up, [hidden, inter] down) as stored.
absl::StatusOr<StoredMlp> ReadStoredMlp(const Checkpoint& ckpt, const MlpTensorNames& n,
                                        int64_t inter, int64_t hidden) {
  StoredMlp m;
  m.intermediate = static_cast<int>(inter);
  ASSIGN_OR_RETURN(m.gate, ReadStoredLinear(ckpt, n.gate, {inter, hidden}));
  ASSIGN_OR_RETURN(m.up, ReadStoredLinear(ckpt, n.up, {inter, hidden}));
  ASSIGN_OR_RETURN(m.down, ReadStoredLinear(ckpt, n.down, {hidden, inter}));
  return m;
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
  const MlpTensorNames n = DeepSeekMlpNames(prefix);
  return ReadMlpTensors(ckpt, "", inter, hidden, n.gate, n.up, n.down);
}

bool IsPackedFp4(DType t) { return t == DType::kI8 || t == DType::kU8; }

// The scale tensor of quantized weight `name`: V3's "<name>_scale_inv", or
// V4's "<x>.scale" for "<x>.weight"; nullptr if there is neither.
const TensorView* ScaleOf(const Checkpoint& ckpt, const std::string& name) {
  auto it = ckpt.tensors().find(name + "_scale_inv");
  if (it != ckpt.tensors().end()) return it->second;
  if (!absl::EndsWith(name, ".weight")) return nullptr;
  it = ckpt.tensors().find(name.substr(0, name.size() - 7) + ".scale");
  return it == ckpt.tensors().end() ? nullptr : it->second;
}

std::string ScaleNames(const std::string& name) {
  if (!absl::EndsWith(name, ".weight")) return absl::StrCat("\"", name, "_scale_inv\"");
  return absl::StrCat("\"", name, "_scale_inv\" or \"", name.substr(0, name.size() - 7),
                      ".scale\"");
}

// An F8_E4M3 weight's block scale: float (F32, BF16 or V4's ue8m0 F8_E8M0), one
// per 128 x 128 block; INVALID_ARGUMENT naming the tensor otherwise.
absl::StatusOr<const TensorView*> CheckFp8Scale(const Checkpoint& ckpt, const TensorView& v) {
  const TensorView* s = ScaleOf(ckpt, v.name);
  const std::vector<int64_t> want = {
      (v.shape.empty() ? 1 : (v.shape[0] + kFp8Block - 1) / kFp8Block),
      v.shape.size() > 1 ? (v.shape[1] + kFp8Block - 1) / kFp8Block : 1};
  if (v.shape.size() != 2 || s == nullptr || s->shape != want ||
      (s->dtype != DType::kF32 && s->dtype != DType::kBF16 && s->dtype != DType::kF8E8M0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        v.file, ": F8_E4M3 tensor \"", v.name, "\" needs a float (F32, BF16 or ", "F8_E8M0) ",
        ScaleNames(v.name), " of shape ", ShapeStr(want), " (128x128 blocks)",
        s == nullptr
            ? ""
            : absl::StrCat("; found ", std::string(DTypeName(s->dtype)), " ", s->ShapeString())));
  }
  return s;
}

// An F8_E4M3 weight's codes hold no NaN (s.1111.111): e4m3 has no infinities,
// so a NaN code is a corrupt file, not a weight (which would turn every logit
// it reaches into NaN, on the CPU and the GPU alike). INVALID_ARGUMENT naming
// the tensor and the first such element. Eight bytes a step: a byte's low
// seven bits plus one carry into its top bit iff all seven are set.
absl::Status CheckFp8Codes(const TensorView& v) {
  const uint8_t* d = v.data;
  const int64_t n = v.nbytes;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, d + i, 8);
    if ((((w & 0x7F7F7F7F7F7F7F7Full) + 0x0101010101010101ull) & 0x8080808080808080ull) != 0) break;
  }
  for (; i < n; ++i) {
    if ((d[i] & 0x7F) == 0x7F) {
      const int64_t cols = v.shape.size() > 1 ? v.shape[1] : 1;
      return absl::InvalidArgumentError(absl::StrCat(v.file, ": F8_E4M3 tensor \"", v.name,
                                                     "\" holds a NaN code at [", i / cols, ", ",
                                                     i % cols, "]"));
    }
  }
  return absl::OkStatus();
}

// An MXFP4 weight of logical shape `shape` [n, k]: e2m1 pairs [n, k / 2] and
// a ue8m0 (F8_E8M0 or U8) "<x>.scale" [n, k / 32]; its scale, or
// INVALID_ARGUMENT naming the tensor.
absl::StatusOr<const TensorView*> CheckMxfp4(const Checkpoint& ckpt, const TensorView& v,
                                             const std::vector<int64_t>& shape) {
  if (shape.size() != 2 || shape[1] % cpu::kMxfp4Block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(v.file, ": tensor \"", v.name, "\" is ", std::string(DTypeName(v.dtype)),
                     " (MXFP4 e2m1 pairs) but its shape ", ShapeStr(shape),
                     " is not a matrix whose rows are whole 32-value blocks"));
  }
  const std::vector<int64_t> packed = {shape[0], shape[1] / 2};
  if (v.shape != packed) {
    return absl::InvalidArgumentError(
        absl::StrCat(v.file, ": MXFP4 tensor \"", v.name, "\" has shape ", v.ShapeString(), " but ",
                     ShapeStr(shape), " packs two e2m1 values a byte into ", ShapeStr(packed)));
  }
  const std::vector<int64_t> want = {shape[0], shape[1] / cpu::kMxfp4Block};
  const TensorView* s = nullptr;
  if (absl::EndsWith(v.name, ".weight")) {
    auto it = ckpt.tensors().find(v.name.substr(0, v.name.size() - 7) + ".scale");
    if (it != ckpt.tensors().end()) s = it->second;
  }
  if (s == nullptr || s->shape != want || (s->dtype != DType::kF8E8M0 && s->dtype != DType::kU8)) {
    return absl::InvalidArgumentError(absl::StrCat(
        v.file, ": MXFP4 tensor \"", v.name, "\" needs a ue8m0 (F8_E8M0) \"",
        absl::StripSuffix(v.name, ".weight"), ".scale\" of shape ", ShapeStr(want),
        " (one per 32 inputs)",
        s == nullptr
            ? ""
            : absl::StrCat("; found ", std::string(DTypeName(s->dtype)), " ", s->ShapeString())));
  }
  return s;
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
  s.push_back({kEmbedTokensTensor, {c.vocab_size, h}});
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
  if (!c.tie_word_embeddings) s.push_back({kLmHeadTensor, {c.vocab_size, h}});
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
    if (IsPackedFp4(v.dtype)) {
      ASSIGN_OR_RETURN(const TensorView* scale, CheckMxfp4(ckpt, v, spec.shape));
      expected.insert(scale->name);
      continue;
    }
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
    if (c.mxfp4_experts && RoutedExpertOf(spec.name) >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          v.file, ": routed expert tensor \"", spec.name, "\" is ", std::string(DTypeName(v.dtype)),
          " but config.json's expert_dtype fp4 means MXFP4 (I8 e2m1 pairs with a .scale)"));
    }
    if (v.dtype == DType::kF8E4M3) {
      ASSIGN_OR_RETURN(const TensorView* scale, CheckFp8Scale(ckpt, v));
      expected.insert(scale->name);
      continue;
    }
    if (v.dtype != DType::kF32 && v.dtype != DType::kBF16 && v.dtype != DType::kF16) {
      return absl::InvalidArgumentError(absl::StrCat(
          v.file, ": tensor \"", spec.name, "\" has dtype ", std::string(DTypeName(v.dtype)),
          "; weights must be F32, BF16, F16, F8_E4M3 (with a block scale) or I8/U8 MXFP4 "
          "(with a .scale)"));
    }
  }
  std::vector<std::string> extra;
  for (const auto& [name, view] : ckpt.tensors()) {
    if (expected.count(name)) continue;
    if (LayerIndexOf(name) >= c.num_hidden_layers) continue;  // MTP layers
    if (c.tie_word_embeddings && name == kLmHeadTensor) continue;
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
  ASSIGN_OR_RETURN(const TensorView* v, ckpt.Get(name));
  if (IsPackedFp4(v->dtype)) {
    ASSIGN_OR_RETURN(const TensorView* scale, CheckMxfp4(ckpt, *v, shape));
    ckpt.WillRead(*v);
    std::vector<float> out(static_cast<size_t>(shape[0] * shape[1]));
    cpu::DequantizeMxfp4(v->data, scale->data, out.data(), static_cast<int>(shape[0]),
                         static_cast<int>(shape[1]));
    ckpt.Consumed(*v);
    ckpt.Consumed(*scale);
    return out;
  }
  if (v->dtype == DType::kF8E4M3) {
    ASSIGN_OR_RETURN(StoredLinear stored, ReadStoredLinear(ckpt, name, shape));
    StoredToValues(ckpt, &stored);
    return std::move(stored.values);
  }
  ASSIGN_OR_RETURN(v, GetShaped(ckpt, name, shape));
  if (!IsFloatDType(v->dtype) || v->dtype == DType::kF8E8M0) {
    return absl::InvalidArgumentError(absl::StrCat(v->file, ": tensor \"", name, "\" is ",
                                                   std::string(DTypeName(v->dtype)),
                                                   ", expected floats"));
  }
  ckpt.WillRead(*v);
  std::vector<float> out(v->numel());
  ConvertToF32(v->dtype, v->data, out.size(), out.data());
  ckpt.Consumed(*v);
  return out;
}

absl::Status ReadTensorAsBf16(
    const Checkpoint& ckpt, const std::string& name, const std::vector<int64_t>& shape,
    const std::function<absl::Status(int64_t row0, int64_t rows, const void* bf16)>& fn) {
  ASSIGN_OR_RETURN(const TensorView* v, ckpt.Get(name));
  const int64_t rows = shape.empty() ? 1 : shape[0];
  if (v->dtype == DType::kBF16 || v->dtype == DType::kF32 || v->dtype == DType::kF16) {
    ASSIGN_OR_RETURN(v, GetShaped(ckpt, name, shape));
    ckpt.WillRead(*v);
    absl::Status status;
    if (v->dtype == DType::kBF16) {
      status = fn(0, rows, v->data);
    } else {
      const int64_t cols = rows > 0 ? v->numel() / rows : 0;
      const int64_t chunk = std::max<int64_t>(1, (int64_t{8} << 20) / std::max<int64_t>(cols, 1));
      std::vector<float> f32;
      std::vector<uint16_t> bf16;
      for (int64_t r = 0; r < rows && status.ok(); r += chunk) {
        const int64_t n = std::min(chunk, rows - r);
        f32.resize(n * cols);
        bf16.resize(n * cols);
        ConvertToF32(v->dtype, v->data + r * cols * DTypeSize(v->dtype), f32.size(), f32.data());
        for (size_t i = 0; i < f32.size(); ++i) bf16[i] = F32ToBf16(f32[i]);
        status = fn(r, n, bf16.data());
      }
    }
    ckpt.Consumed(*v);
    return status;
  }
  ASSIGN_OR_RETURN(const std::vector<float> values, ReadTensorF32(ckpt, name, shape));
  std::vector<uint16_t> bf16(values.size());
  for (size_t i = 0; i < values.size(); ++i) bf16[i] = F32ToBf16(values[i]);
  return fn(0, rows, bf16.data());
}

absl::StatusOr<StoredLinear> ReadStoredLinear(const Checkpoint& ckpt, const std::string& name,
                                              const std::vector<int64_t>& shape) {
  StoredLinear s;
  ASSIGN_OR_RETURN(const TensorView* v, ckpt.Get(name));
  if (v->dtype != DType::kF8E4M3) {
    ASSIGN_OR_RETURN(s.values, ReadTensorF32(ckpt, name, shape));
    return s;
  }
  ASSIGN_OR_RETURN(v, GetShaped(ckpt, name, shape));
  ASSIGN_OR_RETURN(s.scale_view, CheckFp8Scale(ckpt, *v));
  ckpt.WillRead(*v);
  RETURN_IF_ERROR(CheckFp8Codes(*v));
  s.codes = v;
  s.scale.resize(s.scale_view->numel());
  ConvertToF32(s.scale_view->dtype, s.scale_view->data, s.scale.size(), s.scale.data());
  return s;
}

void ReleaseStoredLinear(const Checkpoint& ckpt, const StoredLinear& s) {
  if (!s.fp8()) return;
  ckpt.Consumed(*s.codes);
  ckpt.Consumed(*s.scale_view);
}

void StoredToValues(const Checkpoint& ckpt, StoredLinear* s) {
  if (!s->fp8()) return;
  const TensorView& v = *s->codes;
  s->values.resize(v.numel());
  ConvertToF32(v.dtype, v.data, s->values.size(), s->values.data());
  const int64_t rows = v.shape[0], cols = v.shape[1];
  const int64_t bcols = (cols + kFp8Block - 1) / kFp8Block;
  for (int64_t r = 0; r < rows; ++r) {
    const float* scale_row = &s->scale[(r / kFp8Block) * bcols];
    float* row = &s->values[r * cols];
    for (int64_t col = 0; col < cols; ++col) row[col] *= scale_row[col / kFp8Block];
  }
  ReleaseStoredLinear(ckpt, *s);
  s->codes = s->scale_view = nullptr;
  s->scale.clear();
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
  ckpt.Consumed(*v);
  return out;
}

int RoutedExpertOf(const std::string& name) {
  if (LayerIndexOf(name) < 0) return -1;
  size_t at = name.find(".experts.");
  if (at == std::string::npos) return -1;
  at += std::string(".experts.").size();
  const size_t end = name.find('.', at);
  int e = -1;
  if (end == std::string::npos || !absl::SimpleAtoi(name.substr(at, end - at), &e)) return -1;
  return e;
}

namespace {

// Whether loading `config` reads tensor `name` (ValidateCheckpoint's ignored
// extras are not read).
bool IsLoaded(const ModelConfig& c, const std::string& name) {
  if (LayerIndexOf(name) >= c.num_hidden_layers) return false;  // MTP layers
  if (c.tie_word_embeddings && name == kLmHeadTensor) return false;
  return !absl::EndsWith(name, "rotary_emb.inv_freq") && !absl::StartsWith(name, "mtp.");
}

}  // namespace

uint64_t AttentionLoadBytes(const ModelConfig& c, const Checkpoint& ckpt) {
  uint64_t n = 0;
  for (const auto& [name, view] : ckpt.tensors()) {
    if (IsLoaded(c, name) && RoutedExpertOf(name) < 0) n += view->nbytes;
  }
  return n;
}

uint64_t ExpertLoadBytes(const ModelConfig& c, const Checkpoint& ckpt, const std::set<int>& ids) {
  uint64_t n = 0;
  for (const auto& [name, view] : ckpt.tensors()) {
    const int e = RoutedExpertOf(name);
    if (e >= 0 && IsLoaded(c, name) && (ids.empty() || ids.count(e))) n += view->nbytes;
  }
  return n;
}

const char kEmbedTokensTensor[] = "model.embed_tokens.weight";
const char kFinalNormTensor[] = "model.norm.weight";
const char kLmHeadTensor[] = "lm_head.weight";

absl::Status LoadAttentionLayer(const ModelConfig& c, const Checkpoint& ckpt, int l,
                                AttentionLayerWeights* lw, StoredLayerLinears* stored) {
  const std::string p = Layer(l);
  const int64_t h = c.hidden_size, heads = c.num_attention_heads;
  // A linear into *values, or (FP8, with `stored`) left as stored in *keep.
  auto linear = [&](const std::string& name, const std::vector<int64_t>& shape,
                    std::vector<float>* values, StoredLinear* keep) -> absl::Status {
    if (stored == nullptr) {
      ASSIGN_OR_RETURN(*values, ReadTensorF32(ckpt, name, shape));
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(StoredLinear s, ReadStoredLinear(ckpt, name, shape));
    if (s.fp8()) {
      *keep = std::move(s);
    } else {
      *values = std::move(s.values);
    }
    return absl::OkStatus();
  };
  // A SwiGLU MLP into *m, or (all three FP8, with `stored`) left in stored->mlp.
  auto mlp = [&](const std::string& prefix, int64_t inter, MlpWeights* m) -> absl::Status {
    if (stored == nullptr) {
      ASSIGN_OR_RETURN(*m, ReadMlp(ckpt, prefix, static_cast<int>(inter), static_cast<int>(h)));
      return absl::OkStatus();
    }
    StoredMlp& sm = stored->mlp;
    ASSIGN_OR_RETURN(sm, ReadStoredMlp(ckpt, DeepSeekMlpNames(prefix), inter, h));
    if (sm.gate.fp8() && sm.up.fp8() && sm.down.fp8()) return absl::OkStatus();
    for (StoredLinear* x : {&sm.gate, &sm.up, &sm.down}) StoredToValues(ckpt, x);
    m->intermediate = static_cast<int>(inter);
    m->gate_up = std::move(sm.gate.values);
    m->gate_up.insert(m->gate_up.end(), sm.up.values.begin(), sm.up.values.end());
    m->down = std::move(sm.down.values);
    sm = StoredMlp{};
    return absl::OkStatus();
  };
  StoredLayerLinears unused;
  StoredLayerLinears& keep = stored != nullptr ? *stored : unused;
  ASSIGN_OR_RETURN(lw->input_layernorm, ReadTensorF32(ckpt, p + "input_layernorm.weight", {h}));
  ASSIGN_OR_RETURN(lw->post_attention_layernorm,
                   ReadTensorF32(ckpt, p + "post_attention_layernorm.weight", {h}));
  if (c.q_lora_rank > 0) {
    RETURN_IF_ERROR(
        linear(p + "self_attn.q_a_proj.weight", {c.q_lora_rank, h}, &lw->q_a_proj, &keep.q));
    ASSIGN_OR_RETURN(lw->q_a_layernorm,
                     ReadTensorF32(ckpt, p + "self_attn.q_a_layernorm.weight", {c.q_lora_rank}));
    RETURN_IF_ERROR(linear(p + "self_attn.q_b_proj.weight",
                           {heads * c.qk_head_dim(), c.q_lora_rank}, &lw->q_b_proj, &keep.q_b));
  } else {
    RETURN_IF_ERROR(
        linear(p + "self_attn.q_proj.weight", {heads * c.qk_head_dim(), h}, &lw->q_proj, &keep.q));
  }
  RETURN_IF_ERROR(linear(p + "self_attn.kv_a_proj_with_mqa.weight",
                         {c.kv_lora_rank + c.qk_rope_head_dim, h}, &lw->kv_a_proj, &keep.kv_a));
  ASSIGN_OR_RETURN(lw->kv_a_layernorm,
                   ReadTensorF32(ckpt, p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}));
  ASSIGN_OR_RETURN(lw->kv_b_proj,
                   ReadTensorF32(ckpt, p + "self_attn.kv_b_proj.weight",
                                 {heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}));
  RETURN_IF_ERROR(
      linear(p + "self_attn.o_proj.weight", {h, heads * c.v_head_dim}, &lw->o_proj, &keep.o_proj));
  if (c.has_indexer()) {
    const int64_t d = c.indexer.head_dim;
    ASSIGN_OR_RETURN(lw->indexer_wq_b, ReadTensorF32(ckpt, p + "self_attn.indexer.wq_b.weight",
                                                     {c.indexer.n_heads * d, c.q_lora_rank}));
    ASSIGN_OR_RETURN(lw->indexer_wk,
                     ReadTensorF32(ckpt, p + "self_attn.indexer.wk.weight", {d, h}));
    ASSIGN_OR_RETURN(lw->indexer_k_norm,
                     ReadTensorF32(ckpt, p + "self_attn.indexer.k_norm.weight", {d}));
    ASSIGN_OR_RETURN(lw->indexer_k_norm_bias,
                     ReadTensorF32(ckpt, p + "self_attn.indexer.k_norm.bias", {d}));
    ASSIGN_OR_RETURN(
        lw->indexer_weights_proj,
        ReadTensorF32(ckpt, p + "self_attn.indexer.weights_proj.weight", {c.indexer.n_heads, h}));
  }
  lw->is_moe = c.IsMoeLayer(l);
  if (!lw->is_moe) {
    return mlp(p + "mlp.", c.intermediate_size, &lw->dense_mlp);
  }
  ASSIGN_OR_RETURN(lw->gate, ReadTensorF32(ckpt, p + "mlp.gate.weight", {c.n_routed_experts, h}));
  if (c.topk_method == TopkMethod::kNoauxTc) {
    ASSIGN_OR_RETURN(lw->gate_bias, ReadTensorF32(ckpt, p + "mlp.gate.e_score_correction_bias",
                                                  {c.n_routed_experts}));
  }
  if (c.n_shared_experts > 0) {
    RETURN_IF_ERROR(mlp(p + "mlp.shared_experts.",
                        static_cast<int64_t>(c.moe_intermediate_size) * c.n_shared_experts,
                        &lw->shared_experts));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<AttentionWeights>> AttentionWeights::Load(const ModelConfig& c,
                                                                         const Checkpoint& ckpt) {
  auto w = std::make_unique<AttentionWeights>();
  ckpt.PlanRead(AttentionLoadBytes(c, ckpt));
  if (c.layers() == LayerArch::kV4) {
    RETURN_IF_ERROR(LoadV4AttentionWeights(c, ckpt, w.get()));
    return w;
  }
  const int64_t h = c.hidden_size;
  ASSIGN_OR_RETURN(w->embed_tokens, ReadTensorF32(ckpt, kEmbedTokensTensor, {c.vocab_size, h}));
  w->layers.resize(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    RETURN_IF_ERROR(LoadAttentionLayer(c, ckpt, l, &w->layers[l]));
  }
  ASSIGN_OR_RETURN(w->norm, ReadTensorF32(ckpt, kFinalNormTensor, {h}));
  if (!c.tie_word_embeddings) {
    ASSIGN_OR_RETURN(w->lm_head, ReadTensorF32(ckpt, kLmHeadTensor, {c.vocab_size, h}));
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

// A routed expert's three tensors.
MlpTensorNames ExpertNames(const ModelConfig& c, int layer, int expert) {
  const std::string p = ExpertPrefix(c, layer, expert);
  if (c.layers() == LayerArch::kV4) return {p + "w1.weight", p + "w3.weight", p + "w2.weight"};
  return DeepSeekMlpNames(p);
}

}  // namespace

absl::StatusOr<StoredMlp> ReadStoredExpert(const ModelConfig& c, const Checkpoint& ckpt, int layer,
                                           int expert) {
  return ReadStoredMlp(ckpt, ExpertNames(c, layer, expert), c.moe_intermediate_size, c.hidden_size);
}

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

absl::StatusOr<std::unique_ptr<ExpertShardWeights>> ExpertShardWeights::Deferred(
    const ModelConfig& c, const Checkpoint& ckpt, std::set<int> expert_ids) {
  ASSIGN_OR_RETURN(std::unique_ptr<ExpertShardWeights> w, Placeholder(c, std::move(expert_ids)));
  w->deferred = &ckpt;
  return w;
}

bool ExpertShardWeights::is_placeholder() const {
  if (deferred != nullptr) return false;
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
  ckpt.PlanRead(ExpertLoadBytes(c, ckpt, expert_ids));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.IsMoeLayer(l)) continue;
    for (int e : expert_ids) {
      const MlpTensorNames n = ExpertNames(c, l, e);
      ASSIGN_OR_RETURN(w->layers[l][e], ReadMlpTensors(ckpt, "", c.moe_intermediate_size,
                                                       c.hidden_size, n.gate, n.up, n.down));
    }
  }
  return w;
}

}  // namespace moesh
