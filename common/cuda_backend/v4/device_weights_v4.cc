// DeepSeek-V4's layers on the device (device_weights.h DeviceLayerWeights::V4).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/cuda_backend/device_weights.h"

namespace moesh::cuda {
void DeviceWeights::AddV4Layers(const ModelConfig& c, std::vector<Slot>* slots) {
  using Kind = Slot::Kind;
  auto fan = [](int64_t k) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(k))); };
  const int64_t h = c.hidden_size, heads = c.num_attention_heads, d = c.v4.head_dim,
                hc = c.v4.hc_mult;
  const int64_t n_mix = (2 + hc) * hc, qr = c.q_lora_rank, ni = c.indexer.n_heads,
                di = c.indexer.head_dim;
  const int64_t groups = c.v4.o_groups, r = c.v4.o_lora_rank, in_g = heads * d / groups;
  layers_.assign(c.num_hidden_layers, DeviceLayerWeights{});
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    DeviceLayerWeights& w = layers_[l];
    DeviceLayerWeights::V4& v = w.v4;
    const int series = c.v4.CompressSeries(l), rate = c.v4.CompressRate(l);
    const bool csa = series == 2;
    Add(slots, &w.input_norm, h, 0.05f, 1.0f);
    Add(slots, &w.post_norm, h, 0.05f, 1.0f);
    for (float** fn : {&v.hc_attn_fn, &v.hc_ffn_fn}) Add(slots, fn, n_mix * hc * h, fan(hc * h));
    for (float** base : {&v.hc_attn_base, &v.hc_ffn_base}) Add(slots, base, n_mix, 0.5f);
    for (float** scale : {&v.hc_attn_scale, &v.hc_ffn_scale}) Add(slots, scale, 3, 0.05f, 1.0f);
    v.row_width = c.V4RowWidth(l);
    v.a_width = static_cast<int>(qr + v.row_width + (csa ? ni : 0));
    Add(slots, &v.a, static_cast<size_t>(v.a_width) * h, fan(h));
    Add(slots, &v.q_norm, qr, 0.05f, 1.0f);
    Add(slots, &v.wq_b, heads * d * qr, fan(qr));
    Add(slots, &v.kv_norm, d, 0.05f, 1.0f);
    Add(slots, &v.wo_a, groups * r * in_g, fan(in_g));
    Add(slots, &v.wo_b, h * groups * r, fan(groups * r));
    Add(slots, &v.sinks, heads, 0.5f);
    if (series > 0) {
      Add(slots, &v.comp_ape, static_cast<size_t>(rate) * series * d, 0.1f);
      Add(slots, &v.comp_norm, d, 0.05f, 1.0f);
    }
    if (csa) {
      Add(slots, &v.index_ape, static_cast<size_t>(rate) * 2 * di, 0.1f);
      Add(slots, &v.index_norm, di, 0.05f, 1.0f);
      Add(slots, &w.index_wq_b, ni * di * qr, fan(qr));
    }
    if (c.v4.hash_layers[l]) {  // experts from the token id; the router scores them (no bias)
      Add(slots, &v.tid2eid, static_cast<size_t>(c.vocab_size) * c.num_experts_per_tok, 0.0f, 0.0f,
          Kind::kExpertTable);
    }
    AddMoe(c, !c.v4.hash_layers[l], &w, slots);
  }
  Add(slots, &hc_head_fn_, hc * hc * h, fan(hc * h));
  Add(slots, &hc_head_base_, hc, 0.5f);
  Add(slots, &hc_head_scale_, 1, 0.05f, 1.0f);
}

absl::Status DeviceWeights::UploadV4(const ModelConfig& c, const AttentionWeights& a,
                                     const ExpertShardWeights* experts) {
  const int64_t h = c.hidden_size, heads = c.num_attention_heads, d = c.v4.head_dim,
                hc = c.v4.hc_mult;
  const int64_t n_mix = (2 + hc) * hc, qr = c.q_lora_rank, ni = c.indexer.n_heads,
                di = c.indexer.head_dim;
  const int64_t groups = c.v4.o_groups, r = c.v4.o_lora_rank, in_g = heads * d / groups;
  if (a.layers.size() != static_cast<size_t>(c.num_hidden_layers)) {
    return absl::InvalidArgumentError(
        "DeviceWeights::FromHost: layer count differs from the config");
  }
  std::vector<uint16_t> staging;
  std::vector<float> tmp;
  auto bf16_of = [&](bf16* dst, const std::vector<float>& src, size_t n,
                     const std::string& what) -> absl::Status {
    RETURN_IF_ERROR(CheckSize(src, n, what));
    return UploadBf16(dst, src.data(), n, &staging);
  };
  auto f32_of = [&](float* dst, const std::vector<float>& src, size_t n,
                    const std::string& what) -> absl::Status {
    RETURN_IF_ERROR(CheckSize(src, n, what));
    return UploadWords(dst, src.data(), n);
  };
  RETURN_IF_ERROR(bf16_of(embed_, a.embed_tokens, c.vocab_size * h, "embed_tokens"));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const AttentionLayerWeights& src = a.layers[l];
    const V4LayerWeights& sv = src.v4;
    DeviceLayerWeights& dst = layers_[l];
    const DeviceLayerWeights::V4& v = dst.v4;
    const std::string name = absl::StrCat("layer ", l, " ");
    const int series = c.v4.CompressSeries(l), rate = c.v4.CompressRate(l);
    RETURN_IF_ERROR(bf16_of(dst.input_norm, src.input_layernorm, h, name + "attn_norm"));
    RETURN_IF_ERROR(bf16_of(dst.post_norm, src.post_attention_layernorm, h, name + "ffn_norm"));
    RETURN_IF_ERROR(f32_of(v.hc_attn_fn, sv.hc_attn_fn, n_mix * hc * h, name + "hc_attn_fn"));
    RETURN_IF_ERROR(f32_of(v.hc_attn_base, sv.hc_attn_base, n_mix, name + "hc_attn_base"));
    RETURN_IF_ERROR(f32_of(v.hc_attn_scale, sv.hc_attn_scale, 3, name + "hc_attn_scale"));
    RETURN_IF_ERROR(f32_of(v.hc_ffn_fn, sv.hc_ffn_fn, n_mix * hc * h, name + "hc_ffn_fn"));
    RETURN_IF_ERROR(f32_of(v.hc_ffn_base, sv.hc_ffn_base, n_mix, name + "hc_ffn_base"));
    RETURN_IF_ERROR(f32_of(v.hc_ffn_scale, sv.hc_ffn_scale, 3, name + "hc_ffn_scale"));
    // The stacked first projection, in v4.a's order.
    tmp.clear();
    auto append = [&](const std::vector<float>& part, size_t rows,
                      const std::string& what) -> absl::Status {
      RETURN_IF_ERROR(CheckSize(part, rows * h, name + what));
      tmp.insert(tmp.end(), part.begin(), part.end());
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(append(sv.wq_a, qr, "attn.wq_a"));
    RETURN_IF_ERROR(append(sv.wkv, d, "attn.wkv"));
    if (series > 0) {
      RETURN_IF_ERROR(append(sv.compressor.wkv, series * d, "attn.compressor.wkv"));
      RETURN_IF_ERROR(append(sv.compressor.wgate, series * d, "attn.compressor.wgate"));
    }
    if (series == 2) {
      RETURN_IF_ERROR(append(sv.index_compressor.wkv, 2 * di, "attn.indexer.compressor.wkv"));
      RETURN_IF_ERROR(append(sv.index_compressor.wgate, 2 * di, "attn.indexer.compressor.wgate"));
      RETURN_IF_ERROR(append(sv.index_weights_proj, ni, "attn.indexer.weights_proj"));
    }
    if (tmp.size() != static_cast<size_t>(v.a_width) * h) {
      return absl::InternalError(absl::StrCat("DeviceWeights: ", name, "stacked projection of ",
                                              tmp.size() / h, " rows, laid out for ", v.a_width));
    }
    RETURN_IF_ERROR(UploadBf16(v.a, tmp.data(), tmp.size(), &staging));
    RETURN_IF_ERROR(bf16_of(v.q_norm, sv.q_norm, qr, name + "attn.q_norm"));
    RETURN_IF_ERROR(bf16_of(v.wq_b, sv.wq_b, heads * d * qr, name + "attn.wq_b"));
    RETURN_IF_ERROR(bf16_of(v.kv_norm, sv.kv_norm, d, name + "attn.kv_norm"));
    RETURN_IF_ERROR(bf16_of(v.wo_a, sv.wo_a, groups * r * in_g, name + "attn.wo_a"));
    RETURN_IF_ERROR(bf16_of(v.wo_b, sv.wo_b, h * groups * r, name + "attn.wo_b"));
    RETURN_IF_ERROR(f32_of(v.sinks, sv.sinks, heads, name + "attn.attn_sink"));
    if (series > 0) {
      RETURN_IF_ERROR(f32_of(v.comp_ape, sv.compressor.ape, static_cast<size_t>(rate) * series * d,
                             name + "attn.compressor.ape"));
      RETURN_IF_ERROR(bf16_of(v.comp_norm, sv.compressor.norm, d, name + "attn.compressor.norm"));
    }
    if (series == 2) {
      RETURN_IF_ERROR(f32_of(v.index_ape, sv.index_compressor.ape,
                             static_cast<size_t>(rate) * 2 * di,
                             name + "attn.indexer.compressor.ape"));
      RETURN_IF_ERROR(bf16_of(v.index_norm, sv.index_compressor.norm, di,
                              name + "attn.indexer.compressor.norm"));
      RETURN_IF_ERROR(
          bf16_of(dst.index_wq_b, sv.index_wq_b, ni * di * qr, name + "attn.indexer.wq_b"));
    }
    if (c.v4.hash_layers[l]) {
      if (sv.tid2eid.size() != static_cast<size_t>(c.vocab_size) * c.num_experts_per_tok) {
        return absl::InvalidArgumentError(absl::StrCat("DeviceWeights: ", name, "gate.tid2eid has ",
                                                       sv.tid2eid.size(), " entries"));
      }
      RETURN_IF_ERROR(UploadWords(v.tid2eid, sv.tid2eid.data(), sv.tid2eid.size()));
    } else if (src.gate_bias.empty()) {
      dst.router_bias = nullptr;  // no bias in this checkpoint
    }
    RETURN_IF_ERROR(UploadMoe(c, l, src, &staging));
    if (experts != nullptr) RETURN_IF_ERROR(UploadRoutedExperts(c, l, *experts, &staging));
  }
  RETURN_IF_ERROR(bf16_of(norm_, a.norm, h, "norm"));
  if (!c.tie_word_embeddings)
    RETURN_IF_ERROR(bf16_of(lm_head_, a.lm_head, c.vocab_size * h, "head"));
  RETURN_IF_ERROR(f32_of(hc_head_fn_, a.hc_head_fn, hc * hc * h, "hc_head_fn"));
  RETURN_IF_ERROR(f32_of(hc_head_base_, a.hc_head_base, hc, "hc_head_base"));
  return f32_of(hc_head_scale_, a.hc_head_scale, 1, "hc_head_scale");
}

}  // namespace moesh::cuda
