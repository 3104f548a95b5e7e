#include "common/model/v4/v4_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "base/status.h"
#include "kernels/cpu/mhc.h"
#include "kernels/cpu/moe_gate.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/rope.h"

namespace moesh {
namespace {

// Rotates the trailing `rope` dims of each of `rows` rows (V4 lays heads out
// [nope | rope], pairs interleaved). A negative position undoes a rotation.
void RopeTail(float* x, int rows, int row_dim, int rope, int position,
              const cpu::RopeTable& table) {
  cpu::RopeParams rp;
  rp.x = x;
  rp.num_rows = rows;
  rp.row_stride = row_dim;
  rp.offset = row_dim - rope;
  rp.dim = rope;
  rp.position = position;
  rp.layout = cpu::RopeLayout::kInterleaved;
  rp.table = &table;
  cpu::RunRope(rp);
}

struct Layout {
  int width = 0;    // of the whole cache row
  int series = 0;   // compressor series per token: 2 (CSA), 1 (HCA), 0
  int comp_kv = 0;  // offsets within a row
  int comp_gate = 0;
  int index_kv = 0;
  int index_gate = 0;
};

Layout RowLayout(const ModelConfig& c, int l) {
  Layout r;
  r.width = c.kv_cache_row_width();
  r.series = c.v4.CompressSeries(l);
  r.comp_kv = c.v4.head_dim;
  r.comp_gate = r.comp_kv + r.series * c.v4.head_dim;
  r.index_kv = r.comp_gate + r.series * c.v4.head_dim;
  r.index_gate = r.index_kv + 2 * c.indexer.head_dim;
  return r;
}

// The first `num_entries` compressed entries [num_entries, d] of a sequence
// whose per-token compressor projections sit in its cache rows at kv_off and
// gate_off (`series` series of d each). Entry w softmax-pools, per feature,
// window w's tokens (series 0 for HCA, series 1 for CSA) and, for CSA, window
// w - 1's series 0, with gates + ape; then RMSNorm and RoPE at position w * rate.
std::vector<float> CompressedEntries(const ModelConfig& c, const float* rows, int row_width,
                                     int kv_off, int gate_off, int series, int d, int rate,
                                     int num_entries, const V4CompressorWeights& w,
                                     const cpu::RopeTable& rope) {
  std::vector<float> entries(static_cast<size_t>(num_entries) * d);
  std::vector<float> gates(2 * rate), values(2 * rate);
  const int cd = series * d;  // per-token features in the row
  for (int e = 0; e < num_entries; ++e) {
    float* out = entries.data() + static_cast<size_t>(e) * d;
    for (int f = 0; f < d; ++f) {
      int n = 0;
      auto add = [&](int token, int slot, int feature) {
        const float* row = rows + static_cast<int64_t>(token) * row_width;
        values[n] = row[kv_off + feature];
        gates[n] = row[gate_off + feature] + w.ape[static_cast<int64_t>(slot) * cd + feature];
        ++n;
      };
      if (series == 2 && e > 0) {
        for (int j = 0; j < rate; ++j) add((e - 1) * rate + j, j, f);
      }
      for (int j = 0; j < rate; ++j) add(e * rate + j, j, series == 2 ? d + f : f);
      cpu::SoftmaxRows(gates.data(), 1, n);
      float acc = 0.0f;
      for (int i = 0; i < n; ++i) acc += values[i] * gates[i];
      out[f] = acc;
    }
    cpu::RmsNorm(out, w.norm.data(), out, 1, d, static_cast<float>(c.rms_norm_eps));
    RopeTail(out, 1, d, c.qk_rope_head_dim, e * rate, rope);
  }
  return entries;
}

// One layer's attention for every new token: out[T, hidden].
void Attention(const ModelConfig& c, const AttentionLayerWeights& lw, int l,
               const cpu::RopeTable& main_rope, const cpu::RopeTable& compress_rope,
               absl::Span<const SequenceInput> seqs, const std::vector<int>& offsets,
               const float* normed, int num_tokens, float* out) {
  const V4LayerWeights& w = lw.v4;
  const int h = c.hidden_size, heads = c.num_attention_heads, d = c.v4.head_dim,
            rope = c.qk_rope_head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const Layout lay = RowLayout(c, l);
  const V4AttentionType type = c.v4.layer_types[l];
  const cpu::RopeTable& table = type == V4AttentionType::kSliding ? main_rope : compress_rope;
  const int rate = c.v4.CompressRate(l);
  const int di = c.indexer.head_dim, ni = c.indexer.n_heads;

  std::vector<float> qr(static_cast<size_t>(num_tokens) * c.q_lora_rank);
  cpu::Linear(normed, w.wq_a.data(), qr.data(), num_tokens, c.q_lora_rank, h);
  cpu::RmsNorm(qr.data(), w.q_norm.data(), qr.data(), num_tokens, c.q_lora_rank, eps);
  std::vector<float> q(static_cast<size_t>(num_tokens) * heads * d);
  cpu::Linear(qr.data(), w.wq_b.data(), q.data(), num_tokens, heads * d, c.q_lora_rank);
  const std::vector<float> ones(d, 1.0f);
  cpu::RmsNorm(q.data(), ones.data(), q.data(), num_tokens * heads, d, eps);

  std::vector<float> rows(static_cast<size_t>(num_tokens) * lay.width, 0.0f);
  cpu::Linear(normed, w.wkv.data(), rows.data(), num_tokens, d, h, false, 0, lay.width);
  cpu::RmsNorm(rows.data(), w.kv_norm.data(), rows.data(), num_tokens, d, eps, lay.width,
               lay.width);
  if (lay.series > 0) {
    cpu::Linear(normed, w.compressor.wkv.data(), rows.data() + lay.comp_kv, num_tokens,
                lay.series * d, h, false, 0, lay.width);
    cpu::Linear(normed, w.compressor.wgate.data(), rows.data() + lay.comp_gate, num_tokens,
                lay.series * d, h, false, 0, lay.width);
  }
  std::vector<float> iq, iw;
  if (type == V4AttentionType::kCompressedSparse) {
    cpu::Linear(normed, w.index_compressor.wkv.data(), rows.data() + lay.index_kv, num_tokens,
                2 * di, h, false, 0, lay.width);
    cpu::Linear(normed, w.index_compressor.wgate.data(), rows.data() + lay.index_gate, num_tokens,
                2 * di, h, false, 0, lay.width);
    iq.resize(static_cast<size_t>(num_tokens) * ni * di);
    cpu::Linear(qr.data(), w.index_wq_b.data(), iq.data(), num_tokens, ni * di, c.q_lora_rank);
    iw.resize(static_cast<size_t>(num_tokens) * ni);
    cpu::Linear(normed, w.index_weights_proj.data(), iw.data(), num_tokens, ni, h);
    const float head_scale = 1.0f / std::sqrt(static_cast<float>(ni));
    for (float& x : iw) x *= head_scale;
  }

  std::vector<float> attn(static_cast<size_t>(num_tokens) * heads * d);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float index_scale = di > 0 ? 1.0f / std::sqrt(static_cast<float>(di)) : 0.0f;
  std::vector<float> scratch;
  for (size_t s = 0; s < seqs.size(); ++s) {
    KvSequence* cache = seqs[s].cache;
    const int n = static_cast<int>(seqs[s].tokens.size());
    const int start = cache->num_rows(l);
    const int first = offsets[s];
    for (int i = 0; i < n; ++i) {
      const int t = first + i;
      RopeTail(&q[static_cast<size_t>(t) * heads * d], heads, d, rope, start + i, table);
      RopeTail(&rows[static_cast<size_t>(t) * lay.width], 1, d, rope, start + i, table);
      if (!iq.empty())
        RopeTail(&iq[static_cast<size_t>(t) * ni * di], ni, di, rope, start + i, compress_rope);
    }
    cache->AppendRows(l, &rows[static_cast<size_t>(first) * lay.width], n);
    const float* all = cache->Rows(l, &scratch);
    const int total = start + n;
    const int width = cache->row_width();

    std::vector<float> entries, index_entries;
    const int num_entries = rate > 0 ? total / rate : 0;
    if (num_entries > 0) {
      entries = CompressedEntries(c, all, width, lay.comp_kv, lay.comp_gate, lay.series, d, rate,
                                  num_entries, w.compressor, compress_rope);
      if (type == V4AttentionType::kCompressedSparse) {
        index_entries = CompressedEntries(c, all, width, lay.index_kv, lay.index_gate, 2, di, rate,
                                          num_entries, w.index_compressor, compress_rope);
      }
    }

    std::vector<const float*> keys;
    std::vector<float> logits, index_scores;
    std::vector<int> order;
    for (int i = 0; i < n; ++i) {
      const int t = first + i, pos = start + i;
      keys.clear();
      for (int j = std::max(0, pos - c.v4.sliding_window + 1); j <= pos; ++j) {
        keys.push_back(all + static_cast<int64_t>(j) * width);
      }
      const int visible = rate > 0 ? std::min((pos + 1) / rate, num_entries) : 0;
      if (type == V4AttentionType::kHeavilyCompressed) {
        for (int e = 0; e < visible; ++e) keys.push_back(&entries[static_cast<size_t>(e) * d]);
      } else if (type == V4AttentionType::kCompressedSparse && visible > 0) {
        // The lightning indexer: sum_h w_h * relu(q_h . k_e) * scale; the top
        // index_topk visible entries (ties keep the earlier entry).
        index_scores.assign(visible, 0.0f);
        for (int e = 0; e < visible; ++e) {
          const float* k = &index_entries[static_cast<size_t>(e) * di];
          float acc = 0.0f;
          for (int hh = 0; hh < ni; ++hh) {
            const float* qh = &iq[(static_cast<size_t>(t) * ni + hh) * di];
            float dot = 0.0f;
            for (int x = 0; x < di; ++x) dot += qh[x] * k[x];
            acc += std::max(dot, 0.0f) * index_scale * iw[static_cast<size_t>(t) * ni + hh];
          }
          index_scores[e] = acc;
        }
        order.resize(visible);
        std::iota(order.begin(), order.end(), 0);
        const int keep = std::min(c.indexer.topk, visible);
        std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int a, int b) {
          return index_scores[a] > index_scores[b] || (index_scores[a] == index_scores[b] && a < b);
        });
        for (int k = 0; k < keep; ++k) keys.push_back(&entries[static_cast<size_t>(order[k]) * d]);
      }
      // Softmax over the keys and the head's sink; values are the keys (K = V).
      logits.resize(keys.size());
      for (int hh = 0; hh < heads; ++hh) {
        const float* qh = &q[(static_cast<size_t>(t) * heads + hh) * d];
        float mx = w.sinks[hh];
        for (size_t j = 0; j < keys.size(); ++j) {
          float dot = 0.0f;
          for (int x = 0; x < d; ++x) dot += qh[x] * keys[j][x];
          logits[j] = dot * scale;
          mx = std::max(mx, logits[j]);
        }
        float sum = std::exp(w.sinks[hh] - mx);
        for (float& v : logits) sum += (v = std::exp(v - mx));
        float* o = &attn[(static_cast<size_t>(t) * heads + hh) * d];
        std::fill(o, o + d, 0.0f);
        for (size_t j = 0; j < keys.size(); ++j) {
          const float p = logits[j] / sum;
          for (int x = 0; x < d; ++x) o[x] += p * keys[j][x];
        }
      }
      // The values carried their keys' rotation: undo it at the query's position.
      RopeTail(&attn[static_cast<size_t>(t) * heads * d], heads, d, rope, -pos, table);
    }
  }

  // Grouped output projection: each group of heads to o_lora_rank, then mixed.
  const int groups = c.v4.o_groups, in_g = heads * d / groups, r = c.v4.o_lora_rank;
  std::vector<float> grouped(static_cast<size_t>(num_tokens) * groups * r);
  for (int g = 0; g < groups; ++g) {
    cpu::Linear(attn.data() + static_cast<size_t>(g) * in_g,
                w.wo_a.data() + static_cast<size_t>(g) * r * in_g,
                grouped.data() + static_cast<size_t>(g) * r, num_tokens, r, in_g, false, heads * d,
                groups * r);
  }
  cpu::Linear(grouped.data(), w.wo_b.data(), out, num_tokens, h, groups * r);
}

// One layer's MoE for every new token: out[T, hidden].
absl::Status Moe(const ModelConfig& c, const AttentionLayerWeights& lw, int l,
                 const std::vector<int32_t>& tokens, const float* normed, int num_tokens,
                 ExpertClient* experts, float* out) {
  if (experts == nullptr)
    return absl::FailedPreconditionError("MoE layer without an expert client");
  const int h = c.hidden_size, e = c.n_routed_experts, k = c.num_experts_per_tok;
  std::vector<float> router_logits(static_cast<size_t>(num_tokens) * e);
  cpu::Linear(normed, lw.gate.data(), router_logits.data(), num_tokens, e, h);
  std::vector<int32_t> forced, ids(static_cast<size_t>(num_tokens) * k);
  std::vector<float> weights(static_cast<size_t>(num_tokens) * k);
  cpu::MoeGateParams gp;
  gp.logits = router_logits.data();
  gp.num_tokens = num_tokens;
  gp.num_experts = e;
  gp.top_k = k;
  gp.scoring = c.scoring_func == ScoringFunc::kSqrtSoftplus ? cpu::GateScoring::kSqrtSoftplus
               : c.scoring_func == ScoringFunc::kSigmoid    ? cpu::GateScoring::kSigmoid
                                                            : cpu::GateScoring::kSoftmax;
  gp.select = cpu::GateSelect::kGreedy;
  if (c.v4.hash_layers[l]) {
    forced.resize(ids.size());
    for (int t = 0; t < num_tokens; ++t) {
      std::memcpy(&forced[static_cast<size_t>(t) * k],
                  &lw.v4.tid2eid[static_cast<size_t>(tokens[t]) * k], k * sizeof(int32_t));
    }
    gp.forced_ids = forced.data();
  } else {
    gp.bias = lw.gate_bias.empty() ? nullptr : lw.gate_bias.data();
  }
  gp.renormalize = true;
  gp.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  gp.topk_ids = ids.data();
  gp.topk_weights = weights.data();
  cpu::RunMoeGate(gp);

  MoeDispatch dispatch;
  dispatch.layer = l;
  dispatch.num_tokens = num_tokens;
  dispatch.hidden = h;
  dispatch.top_k = k;
  dispatch.hidden_states = normed;
  dispatch.topk_ids = ids.data();
  dispatch.topk_weights = weights.data();
  RETURN_IF_ERROR(experts->Run(dispatch, out));
  if (c.n_shared_experts > 0) {
    const MlpWeights& m = lw.shared_experts;
    std::vector<float> gate_up(static_cast<size_t>(num_tokens) * 2 * m.intermediate);
    std::vector<float> act(static_cast<size_t>(num_tokens) * m.intermediate);
    cpu::Linear(normed, m.gate_up.data(), gate_up.data(), num_tokens, 2 * m.intermediate, h);
    cpu::SiluAndMul(gate_up.data(), act.data(), num_tokens, m.intermediate,
                    static_cast<float>(c.swiglu_limit));
    cpu::Linear(act.data(), m.down.data(), out, num_tokens, h, m.intermediate, /*accumulate=*/true);
  }
  return absl::OkStatus();
}

}  // namespace

cpu::RopeTable V4RopeTable(const RopeConfig& r, int dim) {
  if (r.type == RopeType::kDefault) return cpu::DefaultRopeTable(r.theta, dim);
  cpu::YarnParams p;
  p.theta = r.theta;
  p.factor = r.factor;
  p.original_max_position_embeddings = r.original_max_position_embeddings;
  p.beta_fast = r.beta_fast;
  p.beta_slow = r.beta_slow;
  p.mscale = r.mscale;
  p.mscale_all_dim = r.mscale_all_dim;
  p.attention_factor = r.attention_factor;
  p.truncate = r.truncate;
  return cpu::YarnRopeTable(p, dim);
}

absl::StatusOr<std::vector<float>> ForwardV4(const ModelConfig& c, const AttentionWeights& weights,
                                             absl::Span<const SequenceInput> seqs,
                                             const std::vector<int>& offsets, int total,
                                             ExpertClient* experts, LogitsFor which) {
  const int h = c.hidden_size, hc = c.v4.hc_mult;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const cpu::RopeTable main_rope = V4RopeTable(c.rope, c.qk_rope_head_dim);
  const cpu::RopeTable compress_rope = V4RopeTable(c.v4.compress_rope, c.qk_rope_head_dim);

  std::vector<int32_t> tokens;
  tokens.reserve(total);
  for (const SequenceInput& in : seqs)
    tokens.insert(tokens.end(), in.tokens.begin(), in.tokens.end());
  // Every stream starts as the token's embedding.
  std::vector<float> x(static_cast<size_t>(total) * hc * h);
  for (int t = 0; t < total; ++t) {
    for (int j = 0; j < hc; ++j) {
      std::memcpy(&x[(static_cast<size_t>(t) * hc + j) * h],
                  &weights.embed_tokens[static_cast<size_t>(tokens[t]) * h], h * sizeof(float));
    }
  }
  std::vector<float> collapsed(static_cast<size_t>(total) * h), normed(collapsed.size()),
      y(collapsed.size());
  std::vector<float> post(static_cast<size_t>(total) * hc),
      comb(static_cast<size_t>(total) * hc * hc);
  auto pre = [&](const std::vector<float>& fn, const std::vector<float>& base,
                 const std::vector<float>& scale, const std::vector<float>& norm) {
    cpu::MhcPreParams p;
    p.x = x.data();
    p.num_tokens = total;
    p.hc = hc;
    p.hidden = h;
    p.fn = fn.data();
    p.base = base.data();
    p.scale = scale.data();
    p.sinkhorn_iters = c.v4.hc_sinkhorn_iters;
    p.hc_eps = static_cast<float>(c.v4.hc_eps);
    p.norm_eps = eps;
    p.collapsed = collapsed.data();
    p.post = post.data();
    p.comb = comb.data();
    cpu::RunMhcPre(p);
    cpu::RmsNorm(collapsed.data(), norm.data(), normed.data(), total, h, eps);
  };
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const AttentionLayerWeights& lw = weights.layers[l];
    pre(lw.v4.hc_attn_fn, lw.v4.hc_attn_base, lw.v4.hc_attn_scale, lw.input_layernorm);
    Attention(c, lw, l, main_rope, compress_rope, seqs, offsets, normed.data(), total, y.data());
    cpu::RunMhcPost(x.data(), y.data(), post.data(), comb.data(), total, hc, h);
    pre(lw.v4.hc_ffn_fn, lw.v4.hc_ffn_base, lw.v4.hc_ffn_scale, lw.post_attention_layernorm);
    RETURN_IF_ERROR(Moe(c, lw, l, tokens, normed.data(), total, experts, y.data()));
    cpu::RunMhcPost(x.data(), y.data(), post.data(), comb.data(), total, hc, h);
  }

  std::vector<int> rows;
  if (which == LogitsFor::kAllTokens) {
    rows.resize(total);
    std::iota(rows.begin(), rows.end(), 0);
  } else {
    for (size_t s = 0; s < seqs.size(); ++s)
      rows.push_back(offsets[s] + static_cast<int>(seqs[s].tokens.size()) - 1);
  }
  std::vector<float> picked(rows.size() * hc * h), head(rows.size() * h);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(&picked[i * hc * h], &x[static_cast<size_t>(rows[i]) * hc * h],
                hc * h * sizeof(float));
  }
  cpu::MhcHeadParams hp;
  hp.x = picked.data();
  hp.num_tokens = static_cast<int>(rows.size());
  hp.hc = hc;
  hp.hidden = h;
  hp.fn = weights.hc_head_fn.data();
  hp.base = weights.hc_head_base.data();
  hp.scale = weights.hc_head_scale.data();
  hp.hc_eps = static_cast<float>(c.v4.hc_eps);
  hp.norm_eps = eps;
  hp.out = head.data();
  cpu::RunMhcHead(hp);
  cpu::RmsNorm(head.data(), weights.norm.data(), head.data(), static_cast<int>(rows.size()), h,
               eps);
  std::vector<float> logits(rows.size() * c.vocab_size);
  cpu::Linear(head.data(), weights.lm_head_data(), logits.data(), static_cast<int>(rows.size()),
              c.vocab_size, h);
  return logits;
}

}  // namespace moesh
