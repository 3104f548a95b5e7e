#include "common/cuda_backend/device_weights.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/dtype.h"
#include "kernels/cpu/mxfp4.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/mxfp4.h"

namespace moesh::cuda {
namespace {

constexpr size_t kAlign = 256;

absl::Status UploadF32(float* dst, const std::vector<float>& src) {
  return UploadWords(dst, src.data(), src.size());
}

}  // namespace

absl::Status UploadWords(void* dst, const void* src, size_t n) {
  return CudaStatus(cudaMemcpy(dst, src, n * 4, cudaMemcpyHostToDevice),
                    "cudaMemcpy H2D (weights)");
}

absl::Status CheckSize(const std::vector<float>& v, size_t n, const std::string& what) {
  if (v.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceWeights: ", what, " has ", v.size(), " values, expected ", n));
  }
  return absl::OkStatus();
}

absl::Status UploadBf16(bf16* dst, const float* src, size_t n, std::vector<uint16_t>* staging) {
  staging->resize(n);
  for (size_t i = 0; i < n; ++i) (*staging)[i] = F32ToBf16(src[i]);
  return CudaStatus(cudaMemcpy(dst, staging->data(), n * 2, cudaMemcpyHostToDevice),
                    "cudaMemcpy H2D (weights)");
}

LinearFormat RoutedExpertFormat(const ModelConfig& c, bool fp8_linears) {
  if (c.layers() == LayerArch::kV4)
    return c.mxfp4_experts ? LinearFormat::kMxfp4 : LinearFormat::kBf16;
  return fp8_linears ? LinearFormat::kFp8 : LinearFormat::kBf16;
}

size_t LinearWeightBytes(LinearFormat format, int64_t n, int64_t k) {
  const size_t count = static_cast<size_t>(n) * k;
  switch (format) {
    case LinearFormat::kFp8:
      return count;
    case LinearFormat::kMxfp4:
      return count / 2;
    default:
      return count * 2;
  }
}

size_t LinearScaleBytes(LinearFormat format, int64_t n, int64_t k) {
  switch (format) {
    case LinearFormat::kFp8:
      return static_cast<size_t>(cpu::Fp8Blocks(static_cast<int>(n))) *
             Fp8ScaleStride(static_cast<int>(k)) * sizeof(float);
    case LinearFormat::kMxfp4:
      return static_cast<size_t>(n) * (k / cpu::kMxfp4Block);
    default:
      return 0;
  }
}

void SetExpertWeights(const DeviceLinear& gate_up, const DeviceLinear& down, ExpertMlpParams* p) {
  p->gate_up = nullptr, p->down = nullptr;
  p->gate_up_fp8 = p->down_fp8 = p->gate_up_fp4 = p->down_fp4 = nullptr;
  p->gate_up_scale = p->down_scale = nullptr;
  p->gate_up_mx_scale = p->down_mx_scale = nullptr;
  switch (gate_up.format()) {
    case LinearFormat::kFp8:
      p->gate_up_fp8 = static_cast<const uint8_t*>(gate_up.w), p->gate_up_scale = gate_up.scale;
      p->down_fp8 = static_cast<const uint8_t*>(down.w), p->down_scale = down.scale;
      break;
    case LinearFormat::kMxfp4:
      p->gate_up_fp4 = static_cast<const uint8_t*>(gate_up.w);
      p->gate_up_mx_scale = gate_up.mx_scale;
      p->down_fp4 = static_cast<const uint8_t*>(down.w), p->down_mx_scale = down.mx_scale;
      break;
    default:
      p->gate_up = static_cast<const bf16*>(gate_up.w), p->down = static_cast<const bf16*>(down.w);
  }
}

DeviceLinear LinearSlice(const DeviceLinear& stack, int64_t i, int64_t n, int64_t k) {
  DeviceLinear out;
  const LinearFormat f = stack.format();
  out.w = static_cast<uint8_t*>(stack.w) + static_cast<size_t>(i) * LinearWeightBytes(f, n, k);
  if (stack.fp8()) {
    out.scale = stack.scale + static_cast<size_t>(i) * cpu::Fp8Blocks(static_cast<int>(n)) *
                                  Fp8ScaleStride(static_cast<int>(k));
  }
  if (stack.mxfp4())
    out.mx_scale = stack.mx_scale + static_cast<size_t>(i) * LinearScaleBytes(f, n, k);
  return out;
}

absl::Status UploadLinear(const DeviceLinear& dst, const float* src, int64_t n, int64_t k,
                          std::vector<uint16_t>* staging, DeviceBuffer<float>* f32_scratch) {
  if (dst.mxfp4()) {  // on the host: the reference quantizer, exact for dequantized MXFP4
    std::vector<uint8_t> packed(LinearWeightBytes(LinearFormat::kMxfp4, n, k)),
        scales(LinearScaleBytes(LinearFormat::kMxfp4, n, k));
    cpu::QuantizeMxfp4(src, packed.data(), scales.data(), static_cast<int>(n), static_cast<int>(k));
    RETURN_IF_CUDA_ERROR(cudaMemcpy(dst.w, packed.data(), packed.size(), cudaMemcpyHostToDevice));
    return CudaStatus(
        cudaMemcpy(dst.mx_scale, scales.data(), scales.size(), cudaMemcpyHostToDevice),
        "cudaMemcpy H2D (MXFP4 scales)");
  }
  if (!dst.fp8()) return UploadBf16(static_cast<bf16*>(dst.w), src, n * k, staging);
  const size_t count = static_cast<size_t>(n) * k;
  if (f32_scratch->size() < count) {
    ASSIGN_OR_RETURN(*f32_scratch, DeviceBuffer<float>::Create(count));
  }
  RETURN_IF_ERROR(UploadWords(f32_scratch->get(), src, count));
  QuantizeFp8BlocksParams p;
  p.w_f32 = f32_scratch->get(), p.q = static_cast<uint8_t*>(dst.w), p.scale = dst.scale;
  p.n = static_cast<int>(n), p.k = static_cast<int>(k);
  RETURN_IF_ERROR(RunQuantizeFp8Blocks(p));
  return CudaStatus(cudaDeviceSynchronize(), "quantizing a linear to FP8");
}

namespace {

// Rows [row0, ...) of a [*, k] linear; REQUIRES (FP8): row0 a multiple of 128.
DeviceLinear LinearRows(const DeviceLinear& l, int64_t row0, int64_t k) {
  DeviceLinear out;
  out.w = static_cast<uint8_t*>(l.w) + row0 * k * (l.fp8() ? 1 : 2);
  if (l.fp8()) out.scale = l.scale + (row0 / cpu::kFp8Block) * Fp8ScaleStride(static_cast<int>(k));
  return out;
}

// dst (FP8) rows [row0, row0 + n) of [*, k] = src's codes and block scales as
// stored; REQUIRES: row0 a multiple of 128.
absl::Status CopyFp8Codes(const DeviceLinear& dst, const StoredLinear& src, int64_t row0, int64_t n,
                          int64_t k) {
  RETURN_IF_CUDA_ERROR(cudaMemcpy(static_cast<uint8_t*>(dst.w) + row0 * k, src.codes->data,
                                  static_cast<size_t>(n) * k, cudaMemcpyHostToDevice));
  const size_t row_blocks = cpu::Fp8Blocks(static_cast<int>(n)),
               col_blocks = cpu::Fp8Blocks(static_cast<int>(k)),
               stride = Fp8ScaleStride(static_cast<int>(k));
  return CudaStatus(
      cudaMemcpy2D(dst.scale + (row0 / cpu::kFp8Block) * stride, stride * sizeof(float),
                   src.scale.data(), col_blocks * sizeof(float), col_blocks * sizeof(float),
                   row_blocks, cudaMemcpyHostToDevice),
      "cudaMemcpy2D H2D (FP8 block scales)");
}

}  // namespace

absl::Status UploadStoredMlp(const Checkpoint& ckpt, StoredMlp* m, const DeviceLinear& gate_up,
                             const DeviceLinear& down, int64_t h, std::vector<uint16_t>* staging,
                             DeviceBuffer<float>* f32_scratch) {
  const int64_t inter = m->intermediate;
  if (gate_up.fp8() && m->gate.fp8() && m->up.fp8() && inter % cpu::kFp8Block == 0) {
    RETURN_IF_ERROR(CopyFp8Codes(gate_up, m->gate, 0, inter, h));
    RETURN_IF_ERROR(CopyFp8Codes(gate_up, m->up, inter, inter, h));
    ReleaseStoredLinear(ckpt, m->gate);
    ReleaseStoredLinear(ckpt, m->up);
  } else {
    StoredToValues(ckpt, &m->gate);
    StoredToValues(ckpt, &m->up);
    std::vector<float> values = std::move(m->gate.values);
    values.insert(values.end(), m->up.values.begin(), m->up.values.end());
    RETURN_IF_ERROR(UploadLinear(gate_up, values.data(), 2 * inter, h, staging, f32_scratch));
  }
  if (down.fp8() && m->down.fp8()) {
    RETURN_IF_ERROR(CopyFp8Codes(down, m->down, 0, h, inter));
    ReleaseStoredLinear(ckpt, m->down);
    return absl::OkStatus();
  }
  StoredToValues(ckpt, &m->down);
  return UploadLinear(down, m->down.values.data(), h, inter, staging, f32_scratch);
}

absl::Status CopyLinear(const DeviceLinear& dst, const DeviceLinear& src, int64_t n, int64_t k,
                        cudaStream_t stream) {
  const LinearFormat f = dst.format();
  if (f != src.format()) return absl::InternalError("CopyLinear: the linears differ in format");
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(dst.w, src.w, LinearWeightBytes(f, n, k), cudaMemcpyDeviceToDevice, stream));
  if (f == LinearFormat::kBf16) return absl::OkStatus();
  void* to = f == LinearFormat::kFp8 ? static_cast<void*>(dst.scale) : dst.mx_scale;
  const void* from = f == LinearFormat::kFp8 ? static_cast<const void*>(src.scale) : src.mx_scale;
  return CudaStatus(
      cudaMemcpyAsync(to, from, LinearScaleBytes(f, n, k), cudaMemcpyDeviceToDevice, stream),
      "cudaMemcpyAsync D2D (weight scales)");
}

absl::Status FillLinear(const DeviceLinear& dst, int64_t n, int64_t k, uint64_t seed, float scale,
                        cudaStream_t stream, DeviceBuffer<bf16>* bf16_scratch) {
  const size_t count = static_cast<size_t>(n) * k;
  if (dst.format() == LinearFormat::kBf16)
    return FillUniform(static_cast<bf16*>(dst.w), count, seed, scale, stream);
  if (bf16_scratch->size() < count) {
    ASSIGN_OR_RETURN(*bf16_scratch, DeviceBuffer<bf16>::Create(count));
  }
  RETURN_IF_ERROR(FillUniform(bf16_scratch->get(), count, seed, scale, stream));
  if (dst.mxfp4()) {
    QuantizeMxfp4Params q;
    q.w = bf16_scratch->get(), q.q = static_cast<uint8_t*>(dst.w), q.scale = dst.mx_scale;
    q.n = static_cast<int>(n), q.k = static_cast<int>(k), q.stream = stream;
    return RunQuantizeMxfp4(q);
  }
  QuantizeFp8BlocksParams p;
  p.w_bf16 = bf16_scratch->get(), p.q = static_cast<uint8_t*>(dst.w), p.scale = dst.scale;
  p.n = static_cast<int>(n), p.k = static_cast<int>(k), p.stream = stream;
  return RunQuantizeFp8Blocks(p);
}

absl::Status DeviceWeights::Allocate(const ModelConfig& c, std::vector<Slot>* slots) {
  config_ = c;
  using Kind = Slot::Kind;
  auto fan = [](int64_t k) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(k))); };
  expert_format_ = RoutedExpertFormat(c, fp8_linears_);
  if (c.layers() == LayerArch::kV4) {
    if (fp8_linears_ && !c.fp8_block_weights) {
      return absl::UnimplementedError(
          "--quantization fp8 is not supported for DeepSeek-V4 on the GPU (its FP8 checkpoints "
          "run with their linears in bf16, exactly, and their routed experts in MXFP4)");
    }
    fp8_linears_ = false;  // an FP8 checkpoint's e4m3 times its power-of-two scales: exact in bf16
    q_width_ = c.q_lora_rank;
    shared_intermediate_ = c.n_shared_experts * c.moe_intermediate_size;
    Add(slots, &embed_, static_cast<size_t>(c.vocab_size) * c.hidden_size, 1.0f, 0.0f,
        Kind::kEmbed);
    AddV4Layers(c, slots);
    Add(slots, &norm_, c.hidden_size, 0.05f, 1.0f);
    if (!c.tie_word_embeddings)
      Add(slots, &lm_head_, static_cast<size_t>(c.vocab_size) * c.hidden_size, fan(c.hidden_size));
    return Place(c, *slots);
  }
  const int64_t h = c.hidden_size, heads = c.num_attention_heads, qk = c.qk_head_dim();
  const int64_t rank = c.kv_lora_rank, rope = c.qk_rope_head_dim, nope = c.qk_nope_head_dim,
                v = c.v_head_dim;
  q_width_ = c.q_lora_rank > 0 ? c.q_lora_rank : static_cast<int>(heads * qk);
  // FP8: each part of qkv_a on its own 128-row blocks.
  auto part = [&](int64_t rows) {
    const int64_t unit = fp8_linears_ ? cpu::kFp8Block : 1;
    return static_cast<int>((rows + unit - 1) / unit * unit);
  };
  kv_col_ = part(q_width_);
  index_col_ = kv_col_ + part(rank + rope);
  index_weights_col_ = index_col_ + (c.has_indexer() ? part(c.indexer.head_dim) : 0);
  qkv_width_ = c.has_indexer() ? index_weights_col_ + c.indexer.n_heads : kv_col_ + rank + rope;
  shared_intermediate_ = c.n_shared_experts * c.moe_intermediate_size;
  layers_.assign(c.num_hidden_layers, DeviceLayerWeights{});
  auto add = [&](auto** target, size_t count, float scale, float offset = 0.0f,
                 Kind kind = Kind::kOther) { Add(slots, target, count, scale, offset, kind); };
  add(&embed_, c.vocab_size * h, 1.0f, 0.0f, Kind::kEmbed);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    DeviceLayerWeights& w = layers_[l];
    add(&w.input_norm, h, 0.05f, 1.0f);
    add(&w.post_norm, h, 0.05f, 1.0f);
    AddLinear(slots, &w.qkv_a, qkv_width_, h, fan(h));
    if (c.q_lora_rank > 0) {
      add(&w.q_a_norm, c.q_lora_rank, 0.05f, 1.0f);
      AddLinear(slots, &w.q_b, heads * qk, c.q_lora_rank, fan(c.q_lora_rank));
    }
    if (c.has_indexer()) {
      add(&w.index_wq_b,
          static_cast<int64_t>(c.indexer.n_heads) * c.indexer.head_dim * c.q_lora_rank,
          fan(c.q_lora_rank));
      add(&w.index_k_norm, c.indexer.head_dim, 0.05f, 1.0f);
      add(&w.index_k_bias, c.indexer.head_dim, 0.05f);
    }
    add(&w.kv_a_norm, rank, 0.05f, 1.0f);
    add(&w.w_uk_t, heads * rank * nope, fan(nope));
    add(&w.w_uv, heads * v * rank, fan(rank));
    AddLinear(slots, &w.o_proj, h, heads * v, fan(heads * v));
    w.is_moe = c.IsMoeLayer(l);
    if (!w.is_moe) {
      AddLinear(slots, &w.dense_gate_up, 2 * static_cast<int64_t>(c.intermediate_size), h, fan(h));
      AddLinear(slots, &w.dense_down, h, c.intermediate_size, fan(c.intermediate_size));
      continue;
    }
    AddMoe(c, c.topk_method == TopkMethod::kNoauxTc, &w, slots);
  }
  add(&norm_, h, 0.05f, 1.0f);
  if (!c.tie_word_embeddings) add(&lm_head_, c.vocab_size * h, fan(h));
  return Place(c, *slots);
}

void DeviceWeights::AddMoe(const ModelConfig& c, bool router_bias, DeviceLayerWeights* w,
                           std::vector<Slot>* slots) {
  auto fan = [](int64_t k) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(k))); };
  const int64_t h = c.hidden_size, e = c.n_routed_experts, inter = c.moe_intermediate_size;
  w->is_moe = true;
  Add(slots, &w->router, e * h, fan(h));
  if (router_bias) Add(slots, &w->router_bias, e, 0.01f);
  if (shared_intermediate_ > 0) {
    AddLinear(slots, &w->shared_gate_up, 2 * static_cast<int64_t>(shared_intermediate_), h, fan(h));
    AddLinear(slots, &w->shared_down, h, shared_intermediate_, fan(shared_intermediate_));
  }
  if (routed_experts_) {
    AddLinear(slots, &w->experts_gate_up, 2 * inter, h, fan(h), e, Slot::Kind::kExpert);
    AddLinear(slots, &w->experts_down, h, inter, fan(inter), e, Slot::Kind::kExpert);
  }
}

size_t DeviceWeights::Slot::Bytes() const {
  return f32 ? count * 4 : LinearWeightBytes(format, 1, static_cast<int64_t>(count));
}

size_t DeviceWeights::Slot::ScaleBytes() const {
  return static_cast<size_t>(batch) * LinearScaleBytes(format, n, k);
}

void DeviceWeights::AddLinear(std::vector<Slot>* slots, DeviceLinear* target, int64_t n, int64_t k,
                              float scale, int64_t batch, Slot::Kind kind) {
  Slot s;
  s.target = &target->w;
  s.count = static_cast<size_t>(batch) * n * k;
  s.scale = scale;
  s.kind = kind;
  s.n = n, s.k = k, s.batch = batch;
  s.format = kind == Slot::Kind::kExpert
                 ? expert_format_
                 : (fp8_linears_ ? LinearFormat::kFp8 : LinearFormat::kBf16);
  if (s.format == LinearFormat::kFp8) s.scale_target = &target->scale;
  if (s.format == LinearFormat::kMxfp4) s.mx_scale_target = &target->mx_scale;
  if (s.format == LinearFormat::kFp8 &&
      kind == Slot::Kind::kLinear) {  // ForwardContext::Gemm's (experts: the grouped GEMM)
    max_fp8_k_ = std::max<int>(max_fp8_k_, static_cast<int>(k));
    max_fp8_n_ = std::max<int>(max_fp8_n_, static_cast<int>(n));
  }
  slots->push_back(s);
}

absl::Status DeviceWeights::Place(const ModelConfig& c, const std::vector<Slot>& slots_in) {
  const std::vector<Slot>* slots = &slots_in;
  const int64_t h = c.hidden_size;
  auto aligned = [](size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; };
  auto scale_bytes = [](const Slot& s) { return s.ScaleBytes(); };
  size_t total = 0;
  int expert_layer_slots = 0;
  for (const Slot& s : *slots) {
    if (s.format == LinearFormat::kFp8 && s.k % 16 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("FP8 linears need input widths that are multiples of 16; this model has a "
                       "linear [",
                       s.n, ", ", s.k, "]"));
    }
    if (s.format == LinearFormat::kMxfp4 && s.k % cpu::kMxfp4Block != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("MXFP4 experts need input widths that are multiples of 32; this model has [",
                       s.n, ", ", s.k, "]"));
    }
    total += aligned(s.Bytes()) + aligned(scale_bytes(s));
  }
  ASSIGN_OR_RETURN(arena_, DeviceBuffer<uint8_t>::Create(total));
  size_t at = 0;
  for (const Slot& s : *slots) {
    *s.target = arena_.get() + at;
    at += aligned(s.Bytes());
    if (s.format == LinearFormat::kFp8)
      *s.scale_target = reinterpret_cast<float*>(arena_.get() + at);
    if (s.format == LinearFormat::kMxfp4) *s.mx_scale_target = arena_.get() + at;
    at += aligned(scale_bytes(s));
    if (s.kind == Slot::Kind::kOther || s.kind == Slot::Kind::kLinear)
      dense_bytes_ += s.Bytes() + scale_bytes(s);
    if (s.kind == Slot::Kind::kExpert && expert_layer_slots++ < 2)  // gate_up, down: one layer's
      expert_bytes_ += static_cast<double>(s.Bytes() + scale_bytes(s)) / s.batch;
  }
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
    dense_bytes_ += static_cast<double>(c.vocab_size) * h * 2;  // lm_head reads all of it
  }
  embed_row_bytes_ = static_cast<double>(h) * 2;
  return absl::OkStatus();
}

double DeviceWeights::StepWeightBytes(int64_t experts_touched, int tokens) const {
  return dense_bytes_ + expert_bytes_ * experts_touched + embed_row_bytes_ * tokens;
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::Dummy(const ModelConfig& config,
                                                                    uint64_t seed,
                                                                    cudaStream_t stream,
                                                                    bool routed_experts,
                                                                    bool fp8_linears) {
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  w->routed_experts_ = routed_experts;
  w->fp8_linears_ = fp8_linears;
  std::vector<Slot> slots;
  RETURN_IF_ERROR(w->Allocate(config, &slots));
  DeviceBuffer<bf16> values;  // an FP8 linear's before quantization
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    const uint64_t sseed = seed * 1000003ull + i;
    if (s.kind == Slot::Kind::kExpertTable) {
      // Hash routing's tid2eid: distinct experts per token.
      const int k = config.num_experts_per_tok, e = config.n_routed_experts;
      std::vector<int32_t> table(s.count);
      for (size_t r = 0; r < s.count / k; ++r) {
        const uint64_t start = (r * 2654435761ull + sseed) % e;
        for (int j = 0; j < k; ++j) table[r * k + j] = static_cast<int32_t>((start + j) % e);
      }
      RETURN_IF_CUDA_ERROR(
          cudaMemcpy(*s.target, table.data(), s.count * 4, cudaMemcpyHostToDevice));
    } else if (s.f32) {
      RETURN_IF_ERROR(
          FillUniform(static_cast<float*>(*s.target), s.count, sseed, s.scale, s.offset, stream));
    } else if (s.format != LinearFormat::kBf16) {  // a stack one linear at a time
      DeviceLinear stack;
      stack.w = *s.target;
      if (s.scale_target != nullptr) stack.scale = *s.scale_target;
      if (s.mx_scale_target != nullptr) stack.mx_scale = *s.mx_scale_target;
      for (int64_t b = 0; b < s.batch; ++b) {
        RETURN_IF_ERROR(FillLinear(LinearSlice(stack, b, s.n, s.k), s.n, s.k, sseed + 7919 * b,
                                   s.scale, stream, &values));
      }
    } else {
      RETURN_IF_ERROR(
          FillUniform(static_cast<bf16*>(*s.target), s.count, sseed, s.scale, s.offset, stream));
    }
  }
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  return w;
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::FromHost(
    const ModelConfig& c, const AttentionWeights& a, const ExpertShardWeights* experts,
    bool fp8_linears) {
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  w->routed_experts_ = experts != nullptr;
  w->fp8_linears_ = fp8_linears;
  std::vector<Slot> slots;
  RETURN_IF_ERROR(w->Allocate(c, &slots));
  if (c.layers() == LayerArch::kV4) {
    RETURN_IF_ERROR(w->UploadV4(c, a, experts));
    return w;
  }
  if (a.layers.size() != static_cast<size_t>(c.num_hidden_layers)) {
    return absl::InvalidArgumentError(
        "DeviceWeights::FromHost: layer count differs from the config");
  }
  std::vector<uint16_t> staging;
  RETURN_IF_ERROR(
      CheckSize(a.embed_tokens, static_cast<size_t>(c.vocab_size) * c.hidden_size, "embed_tokens"));
  RETURN_IF_ERROR(UploadBf16(w->embed_, a.embed_tokens.data(), a.embed_tokens.size(), &staging));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    RETURN_IF_ERROR(w->UploadLayer(c, l, a.layers[l], &staging));
    if (w->layers_[l].is_moe && experts != nullptr)
      RETURN_IF_ERROR(w->UploadRoutedExperts(c, l, *experts, &staging));
  }
  RETURN_IF_ERROR(w->UploadFinal(c, a, &staging));
  w->upload_f32_ = DeviceBuffer<float>();
  return w;
}

absl::StatusOr<std::unique_ptr<DeviceWeights>> DeviceWeights::FromCheckpoint(const ModelConfig& c,
                                                                             const Checkpoint& ckpt,
                                                                             bool routed_experts,
                                                                             bool fp8_linears) {
  if (c.layers() == LayerArch::kV4) {  // through the host's float32 weights, whole
    ASSIGN_OR_RETURN(std::unique_ptr<AttentionWeights> a, AttentionWeights::Load(c, ckpt));
    std::unique_ptr<ExpertShardWeights> experts;
    if (routed_experts) {
      ASSIGN_OR_RETURN(experts, ExpertShardWeights::Load(c, ckpt, {}));
    }
    return FromHost(c, *a, experts.get(), fp8_linears);
  }
  std::unique_ptr<DeviceWeights> w(new DeviceWeights());
  w->routed_experts_ = routed_experts;
  w->fp8_linears_ = fp8_linears;
  std::vector<Slot> slots;
  RETURN_IF_ERROR(w->Allocate(c, &slots));
  ckpt.PlanRead(AttentionLoadBytes(c, ckpt) + (routed_experts ? ExpertLoadBytes(c, ckpt, {}) : 0));
  std::vector<uint16_t> staging;
  const int64_t h = c.hidden_size, inter = c.moe_intermediate_size;
  // A tensor of the checkpoint ([rows] or [rows, cols]) to `dst` in bf16 as it reads.
  auto upload_bf16 = [&ckpt](const char* name, const std::vector<int64_t>& shape, bf16* dst) {
    const int64_t cols = shape.size() > 1 ? shape[1] : 1;
    return ReadTensorAsBf16(
        ckpt, name, shape, [dst, cols](int64_t row0, int64_t n, const void* values) {
          return CudaStatus(
              cudaMemcpy(dst + row0 * cols, values, n * cols * 2, cudaMemcpyHostToDevice),
              "cudaMemcpy H2D (weights)");
        });
  };
  RETURN_IF_ERROR(upload_bf16(kEmbedTokensTensor, {c.vocab_size, h}, w->embed_));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    {
      AttentionLayerWeights src;
      StoredLayerLinears stored;  // FP8 linears copied as stored into FP8 ones
      RETURN_IF_ERROR(LoadAttentionLayer(c, ckpt, l, &src, fp8_linears ? &stored : nullptr));
      RETURN_IF_ERROR(w->UploadLayer(c, l, src, &staging, &stored, &ckpt));
    }
    const DeviceLayerWeights& dst = w->layers_[l];
    if (!dst.is_moe || !routed_experts) continue;
    for (int e = 0; e < c.n_routed_experts; ++e) {
      ASSIGN_OR_RETURN(StoredMlp m, ReadStoredExpert(c, ckpt, l, e));
      RETURN_IF_ERROR(UploadStoredMlp(ckpt, &m, LinearSlice(dst.experts_gate_up, e, 2 * inter, h),
                                      LinearSlice(dst.experts_down, e, h, inter), h, &staging,
                                      &w->upload_f32_));
    }
  }
  RETURN_IF_ERROR(upload_bf16(kFinalNormTensor, {h}, w->norm_));
  if (!c.tie_word_embeddings) {
    RETURN_IF_ERROR(upload_bf16(kLmHeadTensor, {c.vocab_size, h}, w->lm_head_));
  }
  w->upload_f32_ = DeviceBuffer<float>();
  return w;
}

absl::Status DeviceWeights::UploadLayer(const ModelConfig& c, int l,
                                        const AttentionLayerWeights& src,
                                        std::vector<uint16_t>* staging, StoredLayerLinears* stored,
                                        const Checkpoint* ckpt) {
  StoredLayerLinears none;
  if (stored == nullptr) stored = &none;
  const int64_t h = c.hidden_size, heads = c.num_attention_heads, qk = c.qk_head_dim();
  const int64_t rank = c.kv_lora_rank, rope = c.qk_rope_head_dim, nope = c.qk_nope_head_dim,
                v = c.v_head_dim;
  std::vector<float> tmp;
  const DeviceLayerWeights& dst = layers_[l];
  const std::string name = absl::StrCat("layer ", l, " ");
  RETURN_IF_ERROR(CheckSize(src.input_layernorm, h, name + "input_layernorm"));
  RETURN_IF_ERROR(UploadBf16(dst.input_norm, src.input_layernorm.data(), h, staging));
  RETURN_IF_ERROR(CheckSize(src.post_attention_layernorm, h, name + "post_attention_layernorm"));
  RETURN_IF_ERROR(UploadBf16(dst.post_norm, src.post_attention_layernorm.data(), h, staging));
  const std::vector<float>& q_src = c.q_lora_rank > 0 ? src.q_a_proj : src.q_proj;
  const bool stored_parts = stored->q.fp8() || stored->kv_a.fp8();
  if (!stored->q.fp8()) RETURN_IF_ERROR(CheckSize(q_src, q_width_ * h, name + "q projection"));
  if (!stored->kv_a.fp8()) {
    RETURN_IF_ERROR(CheckSize(src.kv_a_proj, (rank + rope) * h, name + "kv_a_proj_with_mqa"));
  }
  // The parts at their rows (zeros between them, FP8 only).
  tmp.assign(static_cast<size_t>(qkv_width_) * h, 0.0f);
  if (!stored_parts) {
    std::copy(q_src.begin(), q_src.end(), tmp.begin());
    std::copy(src.kv_a_proj.begin(), src.kv_a_proj.end(), tmp.begin() + kv_col_ * h);
  }
  if (c.has_indexer()) {
    const int64_t ni = c.indexer.n_heads, di = c.indexer.head_dim;
    RETURN_IF_ERROR(CheckSize(src.indexer_wk, di * h, name + "indexer.wk"));
    RETURN_IF_ERROR(CheckSize(src.indexer_weights_proj, ni * h, name + "indexer.weights_proj"));
    RETURN_IF_ERROR(CheckSize(src.indexer_wq_b, ni * di * c.q_lora_rank, name + "indexer.wq_b"));
    RETURN_IF_ERROR(CheckSize(src.indexer_k_norm, di, name + "indexer.k_norm"));
    RETURN_IF_ERROR(CheckSize(src.indexer_k_norm_bias, di, name + "indexer.k_norm bias"));
    std::copy(src.indexer_wk.begin(), src.indexer_wk.end(), tmp.begin() + index_col_ * h);
    std::copy(src.indexer_weights_proj.begin(), src.indexer_weights_proj.end(),
              tmp.begin() + index_weights_col_ * h);
    RETURN_IF_ERROR(
        UploadBf16(dst.index_wq_b, src.indexer_wq_b.data(), src.indexer_wq_b.size(), staging));
    RETURN_IF_ERROR(UploadWords(dst.index_k_norm, src.indexer_k_norm.data(), di));
    RETURN_IF_ERROR(UploadWords(dst.index_k_bias, src.indexer_k_norm_bias.data(), di));
  }
  if (!stored_parts) {
    RETURN_IF_ERROR(UploadLinear(dst.qkv_a, tmp.data(), qkv_width_, h, staging));
  } else {  // FP8 (each part on its own 128-row blocks): part by part, zeros between
    RETURN_IF_CUDA_ERROR(cudaMemset(dst.qkv_a.w, 0, static_cast<size_t>(qkv_width_) * h));
    auto part = [&](const StoredLinear& s, const float* values, int64_t row0,
                    int64_t n) -> absl::Status {
      if (s.fp8()) return CopyFp8Codes(dst.qkv_a, s, row0, n, h);
      return UploadLinear(LinearRows(dst.qkv_a, row0, h), values, n, h, staging);
    };
    RETURN_IF_ERROR(part(stored->q, q_src.data(), 0, q_width_));
    RETURN_IF_ERROR(part(stored->kv_a, src.kv_a_proj.data(), kv_col_, rank + rope));
    if (c.has_indexer()) {
      const StoredLinear none_stored;
      RETURN_IF_ERROR(part(none_stored, src.indexer_wk.data(), index_col_, c.indexer.head_dim));
      RETURN_IF_ERROR(part(none_stored, src.indexer_weights_proj.data(), index_weights_col_,
                           c.indexer.n_heads));
    }
    ReleaseStoredLinear(*ckpt, stored->q);
    ReleaseStoredLinear(*ckpt, stored->kv_a);
  }
  if (c.q_lora_rank > 0) {
    RETURN_IF_ERROR(CheckSize(src.q_a_layernorm, c.q_lora_rank, name + "q_a_layernorm"));
    RETURN_IF_ERROR(UploadBf16(dst.q_a_norm, src.q_a_layernorm.data(), c.q_lora_rank, staging));
    if (stored->q_b.fp8()) {
      RETURN_IF_ERROR(CopyFp8Codes(dst.q_b, stored->q_b, 0, heads * qk, c.q_lora_rank));
      ReleaseStoredLinear(*ckpt, stored->q_b);
    } else {
      RETURN_IF_ERROR(CheckSize(src.q_b_proj, heads * qk * c.q_lora_rank, name + "q_b_proj"));
      RETURN_IF_ERROR(
          UploadLinear(dst.q_b, src.q_b_proj.data(), heads * qk, c.q_lora_rank, staging));
    }
  }
  RETURN_IF_ERROR(CheckSize(src.kv_a_layernorm, rank, name + "kv_a_layernorm"));
  RETURN_IF_ERROR(UploadBf16(dst.kv_a_norm, src.kv_a_layernorm.data(), rank, staging));
  RETURN_IF_ERROR(CheckSize(src.kv_b_proj, heads * (nope + v) * rank, name + "kv_b_proj"));
  tmp.assign(heads * rank * nope, 0.0f);
  for (int64_t hh = 0; hh < heads; ++hh) {
    for (int64_t i = 0; i < nope; ++i) {
      const float* row = &src.kv_b_proj[(hh * (nope + v) + i) * rank];
      for (int64_t r = 0; r < rank; ++r) tmp[(hh * rank + r) * nope + i] = row[r];
    }
  }
  RETURN_IF_ERROR(UploadBf16(dst.w_uk_t, tmp.data(), tmp.size(), staging));
  tmp.assign(heads * v * rank, 0.0f);
  for (int64_t hh = 0; hh < heads; ++hh) {
    std::memcpy(&tmp[hh * v * rank], &src.kv_b_proj[(hh * (nope + v) + nope) * rank],
                v * rank * sizeof(float));
  }
  RETURN_IF_ERROR(UploadBf16(dst.w_uv, tmp.data(), tmp.size(), staging));
  if (stored->o_proj.fp8()) {
    RETURN_IF_ERROR(CopyFp8Codes(dst.o_proj, stored->o_proj, 0, h, heads * v));
    ReleaseStoredLinear(*ckpt, stored->o_proj);
  } else {
    RETURN_IF_ERROR(CheckSize(src.o_proj, h * heads * v, name + "o_proj"));
    RETURN_IF_ERROR(UploadLinear(dst.o_proj, src.o_proj.data(), h, heads * v, staging));
  }
  if (stored->mlp.gate.fp8()) {  // the dense MLP or the shared experts, as stored
    const DeviceLinear& gate_up = dst.is_moe ? dst.shared_gate_up : dst.dense_gate_up;
    const DeviceLinear& down = dst.is_moe ? dst.shared_down : dst.dense_down;
    RETURN_IF_ERROR(UploadStoredMlp(*ckpt, &stored->mlp, gate_up, down, h, staging, &upload_f32_));
  }
  if (!dst.is_moe) {
    if (stored->mlp.intermediate > 0) return absl::OkStatus();
    const MlpWeights& m = src.dense_mlp;
    RETURN_IF_ERROR(CheckSize(m.gate_up, 2 * static_cast<int64_t>(c.intermediate_size) * h,
                              name + "mlp gate_up"));
    RETURN_IF_ERROR(CheckSize(m.down, h * c.intermediate_size, name + "mlp down"));
    RETURN_IF_ERROR(UploadLinear(dst.dense_gate_up, m.gate_up.data(),
                                 2 * static_cast<int64_t>(c.intermediate_size), h, staging));
    RETURN_IF_ERROR(UploadLinear(dst.dense_down, m.down.data(), h, c.intermediate_size, staging));
    return absl::OkStatus();
  }
  return UploadMoe(c, l, src, staging, /*shared_done=*/stored->mlp.intermediate > 0);
}

absl::Status DeviceWeights::UploadFinal(const ModelConfig& c, const AttentionWeights& a,
                                        std::vector<uint16_t>* staging) {
  const int64_t h = c.hidden_size;
  RETURN_IF_ERROR(CheckSize(a.norm, h, "norm"));
  RETURN_IF_ERROR(UploadBf16(norm_, a.norm.data(), h, staging));
  if (!c.tie_word_embeddings) {
    RETURN_IF_ERROR(CheckSize(a.lm_head, c.vocab_size * h, "lm_head"));
    RETURN_IF_ERROR(UploadBf16(lm_head_, a.lm_head.data(), a.lm_head.size(), staging));
  }
  return absl::OkStatus();
}

absl::Status DeviceWeights::UploadMoe(const ModelConfig& c, int l, const AttentionLayerWeights& src,
                                      std::vector<uint16_t>* staging, bool shared_done) {
  const DeviceLayerWeights& dst = layers_[l];
  const int64_t h = c.hidden_size, ne = c.n_routed_experts;
  const std::string name = absl::StrCat("layer ", l, " ");
  RETURN_IF_ERROR(CheckSize(src.gate, ne * h, name + "gate"));
  RETURN_IF_ERROR(UploadF32(dst.router, src.gate));
  if (dst.router_bias != nullptr) {
    RETURN_IF_ERROR(CheckSize(src.gate_bias, ne, name + "e_score_correction_bias"));
    RETURN_IF_ERROR(UploadF32(dst.router_bias, src.gate_bias));
  }
  if (dst.shared_gate_up.w != nullptr && !shared_done) {
    const MlpWeights& m = src.shared_experts;
    RETURN_IF_ERROR(CheckSize(m.gate_up, 2 * static_cast<int64_t>(shared_intermediate_) * h,
                              name + "shared gate_up"));
    RETURN_IF_ERROR(CheckSize(m.down, h * shared_intermediate_, name + "shared down"));
    RETURN_IF_ERROR(UploadLinear(dst.shared_gate_up, m.gate_up.data(),
                                 2 * static_cast<int64_t>(shared_intermediate_), h, staging));
    RETURN_IF_ERROR(UploadLinear(dst.shared_down, m.down.data(), h, shared_intermediate_, staging));
  }
  return absl::OkStatus();
}

absl::Status DeviceWeights::UploadRoutedExperts(const ModelConfig& c, int l,
                                                const ExpertShardWeights& experts,
                                                std::vector<uint16_t>* staging) {
  const DeviceLayerWeights& dst = layers_[l];
  const int64_t h = c.hidden_size, ne = c.n_routed_experts, inter = c.moe_intermediate_size;
  const std::string name = absl::StrCat("layer ", l, " ");
  auto layer_it = experts.layers.find(l);
  if (layer_it == experts.layers.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceWeights::FromHost: no routed experts for layer ", l));
  }
  for (int64_t e = 0; e < ne; ++e) {
    auto it = layer_it->second.find(static_cast<int>(e));
    if (it == layer_it->second.end()) {
      return absl::InvalidArgumentError(absl::StrCat("DeviceWeights::FromHost: layer ", l,
                                                     " lacks expert ", e, " (need every expert)"));
    }
    RETURN_IF_ERROR(
        CheckSize(it->second.gate_up, 2 * inter * h, absl::StrCat(name, "expert ", e, " gate_up")));
    RETURN_IF_ERROR(
        CheckSize(it->second.down, h * inter, absl::StrCat(name, "expert ", e, " down")));
    RETURN_IF_ERROR(UploadLinear(LinearSlice(dst.experts_gate_up, e, 2 * inter, h),
                                 it->second.gate_up.data(), 2 * inter, h, staging));
    RETURN_IF_ERROR(UploadLinear(LinearSlice(dst.experts_down, e, h, inter), it->second.down.data(),
                                 h, inter, staging));
  }
  return absl::OkStatus();
}

}  // namespace moesh::cuda
