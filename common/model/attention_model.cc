#include "common/model/attention_model.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/model/v4/v4_model.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cpu/moe_gate.h"
#include "kernels/cpu/ops.h"

namespace moesh {
namespace {

// q_a_layernorm and kv_a_layernorm are built without the config's eps.
constexpr float kLatentNormEps = 1e-6f;
// So is the V3.2 indexer's key LayerNorm.
constexpr float kIndexerKeyNormEps = 1e-6f;

}  // namespace

cpu::RopeTable MakeRopeTable(const ModelConfig& c) {
  if (c.rope.type == RopeType::kDefault)
    return cpu::DefaultRopeTable(c.rope.theta, c.qk_rope_head_dim);
  cpu::YarnParams p;
  p.theta = c.rope.theta;
  p.factor = c.rope.factor;
  p.original_max_position_embeddings = c.rope.original_max_position_embeddings;
  if (p.original_max_position_embeddings == 0) {
    // transformers' default for a missing original length.
    p.original_max_position_embeddings = c.max_position_embeddings;
  }
  p.beta_fast = c.rope.beta_fast;
  p.beta_slow = c.rope.beta_slow;
  p.mscale = c.rope.mscale;
  p.mscale_all_dim = c.rope.mscale_all_dim;
  p.attention_factor = c.rope.attention_factor;
  p.truncate = c.rope.truncate;
  return cpu::YarnRopeTable(p, c.qk_rope_head_dim);
}

AttentionModel::AttentionModel(const ModelConfig& config, std::unique_ptr<AttentionWeights> weights)
    : config_(config),
      weights_(std::move(weights)),
      rope_(MakeRopeTable(config)),
      rope_layout_(config.rope_interleave ? cpu::RopeLayout::kInterleaved
                                          : cpu::RopeLayout::kHalves),
      softmax_scale_(static_cast<float>(config.SoftmaxScale())) {}

absl::StatusOr<std::vector<float>> AttentionModel::Forward(absl::Span<const SequenceInput> seqs,
                                                           ExpertClient* experts, LogitsFor which,
                                                           int micro_batches) const {
  const int h = config_.hidden_size;
  std::vector<int> offsets;  // first row of each sequence in the flattened batch
  int total = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const SequenceInput& in = seqs[s];
    if (in.tokens.empty())
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " has no tokens"));
    if (in.cache == nullptr || in.cache->row_width() != kv_row_width()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", s, " has no cache of this model"));
    }
    const int end = in.cache->length() + static_cast<int>(in.tokens.size());
    if (end > in.cache->capacity()) {
      return absl::ResourceExhaustedError(absl::StrCat("sequence ", s, " needs ", end,
                                                       " cached tokens but its cache holds ",
                                                       in.cache->capacity()));
    }
    if (config_.max_position_embeddings > 0 && end > config_.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", s, " reaches ", end,
                                                     " tokens, beyond max_position_embeddings ",
                                                     config_.max_position_embeddings));
    }
    for (int32_t t : in.tokens) {
      if (t < 0 || t >= config_.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "token id ", t, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
      }
    }
    offsets.push_back(total);
    total += static_cast<int>(in.tokens.size());
  }
  if (total == 0) return absl::InvalidArgumentError("empty batch");
  if (config_.layers() == LayerArch::kV4)
    return ForwardV4(config_, *weights_, seqs, offsets, total, experts, which);

  std::vector<float> x(static_cast<size_t>(total) * h);
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (size_t i = 0; i < seqs[s].tokens.size(); ++i) {
      std::memcpy(&x[(offsets[s] + i) * h],
                  &weights_->embed_tokens[static_cast<size_t>(seqs[s].tokens[i]) * h],
                  h * sizeof(float));
    }
  }
  // Micro-batches: contiguous runs of sequences with about equal tokens.
  struct Group {
    size_t begin = 0, end = 0;  // sequences [begin, end)
    int row = 0, tokens = 0;    // first row in x, rows
    std::vector<int> offsets;   // per sequence, relative to `row`
    MlpInFlight mlp;
  };
  std::vector<Group> groups;
  const int want = std::max(1, std::min<int>(micro_batches, static_cast<int>(seqs.size())));
  for (size_t s = 0; s < seqs.size(); ++s) {
    // A new group starts once the current one holds its share of the tokens.
    if (groups.empty() || (static_cast<int>(groups.size()) < want &&
                           static_cast<int64_t>(groups.back().tokens) * want >= total)) {
      Group g;
      g.begin = s;
      g.row = offsets[s];
      groups.push_back(std::move(g));
    }
    Group& g = groups.back();
    g.end = s + 1;
    g.offsets.push_back(offsets[s] - g.row);
    g.tokens += static_cast<int>(seqs[s].tokens.size());
  }
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    for (Group& g : groups) {
      float* gx = x.data() + static_cast<size_t>(g.row) * h;
      AttentionBlock(l, seqs.subspan(g.begin, g.end - g.begin), g.offsets, gx, g.tokens);
      RETURN_IF_ERROR(StartMlp(l, gx, g.tokens, experts, &g.mlp));
    }
    for (Group& g : groups) {
      RETURN_IF_ERROR(FinishMlp(&g.mlp, x.data() + static_cast<size_t>(g.row) * h, g.tokens));
    }
  }

  std::vector<int> rows;
  if (which == LogitsFor::kAllTokens) {
    for (int t = 0; t < total; ++t) rows.push_back(t);
  } else {
    for (size_t s = 0; s < seqs.size(); ++s)
      rows.push_back(offsets[s] + static_cast<int>(seqs[s].tokens.size()) - 1);
  }
  std::vector<float> normed(rows.size() * h);
  for (size_t i = 0; i < rows.size(); ++i) {
    cpu::RmsNorm(&x[static_cast<size_t>(rows[i]) * h], weights_->norm.data(), &normed[i * h], 1, h,
                 static_cast<float>(config_.rms_norm_eps));
  }
  std::vector<float> logits(rows.size() * config_.vocab_size);
  cpu::Linear(normed.data(), weights_->lm_head_data(), logits.data(), static_cast<int>(rows.size()),
              config_.vocab_size, h);
  return logits;
}

void AttentionModel::AttentionBlock(int l, absl::Span<const SequenceInput> seqs,
                                    const std::vector<int>& offsets, float* x,
                                    int num_tokens) const {
  const ModelConfig& c = config_;
  const AttentionLayerWeights& w = weights_->layers[l];
  const int h = c.hidden_size;
  const int heads = c.num_attention_heads;
  const int qk = c.qk_head_dim();
  const int kv_w = kv_row_width();
  const float eps = static_cast<float>(c.rms_norm_eps);

  std::vector<float> normed(static_cast<size_t>(num_tokens) * h);
  cpu::RmsNorm(x, w.input_layernorm.data(), normed.data(), num_tokens, h, eps);

  std::vector<float> q(static_cast<size_t>(num_tokens) * heads * qk);
  std::vector<float> qa;  // q_lora's normalised latent; the indexer's queries start from it
  if (c.q_lora_rank > 0) {
    qa.resize(static_cast<size_t>(num_tokens) * c.q_lora_rank);
    cpu::Linear(normed.data(), w.q_a_proj.data(), qa.data(), num_tokens, c.q_lora_rank, h);
    cpu::RmsNorm(qa.data(), w.q_a_layernorm.data(), qa.data(), num_tokens, c.q_lora_rank,
                 kLatentNormEps);
    cpu::Linear(qa.data(), w.q_b_proj.data(), q.data(), num_tokens, heads * qk, c.q_lora_rank);
  } else {
    cpu::Linear(normed.data(), w.q_proj.data(), q.data(), num_tokens, heads * qk, h);
  }
  // Cache rows [latent | roped key | (V3.2) indexer key], built in place.
  const int mla_w = c.kv_lora_rank + c.qk_rope_head_dim;
  std::vector<float> kv(static_cast<size_t>(num_tokens) * kv_w);
  cpu::Linear(normed.data(), w.kv_a_proj.data(), kv.data(), num_tokens, mla_w, h, false, 0, kv_w);
  cpu::RmsNorm(kv.data(), w.kv_a_layernorm.data(), kv.data(), num_tokens, c.kv_lora_rank,
               kLatentNormEps, kv_w, kv_w);
  IndexerInputs idx;
  if (c.has_indexer()) idx = IndexerProject(w, normed.data(), qa.data(), kv.data(), num_tokens);

  std::vector<float> attn(static_cast<size_t>(num_tokens) * heads * c.v_head_dim);
  std::vector<float> kv_scratch;
  for (size_t s = 0; s < seqs.size(); ++s) {
    KvSequence* cache = seqs[s].cache;
    const int n = static_cast<int>(seqs[s].tokens.size());
    const int start = cache->num_rows(l);
    float* q_s = &q[static_cast<size_t>(offsets[s]) * heads * qk];
    float* kv_s = &kv[static_cast<size_t>(offsets[s]) * kv_w];
    for (int i = 0; i < n; ++i) {
      cpu::RopeParams rp;
      rp.x = q_s + static_cast<size_t>(i) * heads * qk;
      rp.num_rows = heads;
      rp.row_stride = qk;
      rp.offset = c.qk_nope_head_dim;
      rp.dim = c.qk_rope_head_dim;
      rp.position = start + i;
      rp.layout = rope_layout_;
      rp.table = &rope_;
      cpu::RunRope(rp);
      rp.x = kv_s + static_cast<size_t>(i) * kv_w;
      rp.num_rows = 1;
      rp.row_stride = kv_w;
      rp.offset = c.kv_lora_rank;
      cpu::RunRope(rp);
      if (c.has_indexer()) {
        // The indexer rotates the first qk_rope_head_dim dims of its query heads
        // and key in the rotate-half layout (transformers' DeepseekV32Indexer).
        rp.layout = cpu::RopeLayout::kHalves;
        rp.offset = mla_w;  // the key, in the cache row
        cpu::RunRope(rp);
        rp.x =
            &idx.q[(static_cast<size_t>(offsets[s]) + i) * c.indexer.n_heads * c.indexer.head_dim];
        rp.num_rows = c.indexer.n_heads;
        rp.row_stride = c.indexer.head_dim;
        rp.offset = 0;
        cpu::RunRope(rp);
      }
    }
    cache->AppendRows(l, kv_s, n);
    const float* rows = cache->Rows(l, &kv_scratch);

    std::vector<uint8_t> mask;
    if (c.has_indexer()) {
      mask.resize(static_cast<size_t>(n) * (start + n));
      cpu::DsaIndexerParams ip;
      ip.q = &idx.q[static_cast<size_t>(offsets[s]) * c.indexer.n_heads * c.indexer.head_dim];
      ip.num_q = n;
      ip.num_heads = c.indexer.n_heads;
      ip.head_dim = c.indexer.head_dim;
      ip.k = rows + mla_w;
      ip.k_row_stride = kv_w;
      ip.num_kv = start + n;
      ip.q_start_pos = start;
      ip.weights = &idx.weights[static_cast<size_t>(offsets[s]) * c.indexer.n_heads];
      ip.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.indexer.head_dim));
      ip.top_k = c.indexer.topk;
      ip.mask = mask.data();
      cpu::RunDsaIndexer(ip);
    }

    cpu::MlaAttentionParams ap;
    ap.q = q_s;
    ap.num_q = n;
    ap.num_heads = heads;
    ap.qk_nope_head_dim = c.qk_nope_head_dim;
    ap.qk_rope_head_dim = c.qk_rope_head_dim;
    ap.kv_lora_rank = c.kv_lora_rank;
    ap.v_head_dim = c.v_head_dim;
    ap.kv = rows;
    ap.kv_row_stride = kv_w;
    ap.kv_mask = mask.empty() ? nullptr : mask.data();
    ap.num_kv = start + n;
    ap.q_start_pos = start;
    ap.w_kv_b = w.kv_b_proj.data();
    ap.softmax_scale = softmax_scale_;
    ap.out = &attn[static_cast<size_t>(offsets[s]) * heads * c.v_head_dim];
    cpu::RunMlaAttention(ap);
  }
  cpu::Linear(attn.data(), w.o_proj.data(), x, num_tokens, h, heads * c.v_head_dim,
              /*accumulate=*/true);
}

AttentionModel::IndexerInputs AttentionModel::IndexerProject(const AttentionLayerWeights& w,
                                                             const float* normed, const float* qa,
                                                             float* kv, int num_tokens) const {
  const ModelConfig& c = config_;
  const int h = c.hidden_size;
  const int d = c.indexer.head_dim;
  const int kv_w = kv_row_width();
  const int key_offset = c.kv_lora_rank + c.qk_rope_head_dim;
  IndexerInputs idx;
  idx.q.resize(static_cast<size_t>(num_tokens) * c.indexer.n_heads * d);
  cpu::Linear(qa, w.indexer_wq_b.data(), idx.q.data(), num_tokens, c.indexer.n_heads * d,
              c.q_lora_rank);
  cpu::Linear(normed, w.indexer_wk.data(), kv + key_offset, num_tokens, d, h, false, 0, kv_w);
  cpu::LayerNorm(kv + key_offset, w.indexer_k_norm.data(), w.indexer_k_norm_bias.data(),
                 kv + key_offset, num_tokens, d, kIndexerKeyNormEps, kv_w, kv_w);
  idx.weights.resize(static_cast<size_t>(num_tokens) * c.indexer.n_heads);
  cpu::Linear(normed, w.indexer_weights_proj.data(), idx.weights.data(), num_tokens,
              c.indexer.n_heads, h);
  const float head_scale = 1.0f / std::sqrt(static_cast<float>(c.indexer.n_heads));
  for (float& x : idx.weights) x *= head_scale;
  return idx;
}

absl::Status AttentionModel::StartMlp(int l, float* x, int num_tokens, ExpertClient* experts,
                                      MlpInFlight* f) const {
  const ModelConfig& c = config_;
  const AttentionLayerWeights& w = weights_->layers[l];
  const int h = c.hidden_size;
  f->pending.reset();
  std::vector<float>& normed = f->normed;
  normed.resize(static_cast<size_t>(num_tokens) * h);
  cpu::RmsNorm(x, w.post_attention_layernorm.data(), normed.data(), num_tokens, h,
               static_cast<float>(c.rms_norm_eps));

  auto run_mlp = [&](const MlpWeights& m, float* out) {
    std::vector<float> gate_up(static_cast<size_t>(num_tokens) * 2 * m.intermediate);
    std::vector<float> act(static_cast<size_t>(num_tokens) * m.intermediate);
    cpu::Linear(normed.data(), m.gate_up.data(), gate_up.data(), num_tokens, 2 * m.intermediate, h);
    cpu::SiluAndMul(gate_up.data(), act.data(), num_tokens, m.intermediate);
    cpu::Linear(act.data(), m.down.data(), out, num_tokens, h, m.intermediate, /*accumulate=*/true);
  };
  if (!w.is_moe) {
    run_mlp(w.dense_mlp, x);
    return absl::OkStatus();
  }
  if (experts == nullptr)
    return absl::FailedPreconditionError("MoE layer without an expert client");

  const int e = c.n_routed_experts;
  const int k = c.num_experts_per_tok;
  std::vector<float> router_logits(static_cast<size_t>(num_tokens) * e);
  cpu::Linear(normed.data(), w.gate.data(), router_logits.data(), num_tokens, e, h);
  std::vector<int32_t>& ids = f->ids;
  std::vector<float>& weights = f->weights;
  ids.resize(static_cast<size_t>(num_tokens) * k);
  weights.resize(static_cast<size_t>(num_tokens) * k);
  cpu::MoeGateParams gp;
  gp.logits = router_logits.data();
  gp.bias = w.gate_bias.empty() ? nullptr : w.gate_bias.data();
  gp.num_tokens = num_tokens;
  gp.num_experts = e;
  gp.top_k = k;
  gp.n_group = c.n_group;
  gp.topk_group = c.topk_group;
  gp.scoring = c.scoring_func == ScoringFunc::kSoftmax ? cpu::GateScoring::kSoftmax
                                                       : cpu::GateScoring::kSigmoid;
  switch (c.topk_method) {
    case TopkMethod::kGreedy:
      gp.select = cpu::GateSelect::kGreedy;
      break;
    case TopkMethod::kGroupLimitedGreedy:
      gp.select = cpu::GateSelect::kGroupMax;
      break;
    case TopkMethod::kNoauxTc:
      gp.select = cpu::GateSelect::kGroupTop2Sum;
      break;
  }
  gp.renormalize = c.norm_topk_prob;
  gp.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  gp.topk_ids = ids.data();
  gp.topk_weights = weights.data();
  cpu::RunMoeGate(gp);

  MoeDispatch d;
  d.layer = l;
  d.num_tokens = num_tokens;
  d.hidden = h;
  d.top_k = k;
  d.hidden_states = normed.data();
  d.topk_ids = ids.data();
  d.topk_weights = weights.data();
  f->routed.resize(static_cast<size_t>(num_tokens) * h);
  f->pending = experts->Start(d, f->routed.data());
  // The shared experts run on the attention side while the dispatch is in flight.
  if (c.n_shared_experts > 0) run_mlp(w.shared_experts, x);
  return absl::OkStatus();
}

absl::Status AttentionModel::FinishMlp(MlpInFlight* f, float* x, int num_tokens) const {
  if (f->pending == nullptr) return absl::OkStatus();  // dense layer: done in StartMlp
  absl::Status s = f->pending->Wait();
  f->pending.reset();
  RETURN_IF_ERROR(s);
  cpu::Axpy(1.0f, f->routed.data(), x, num_tokens * config_.hidden_size);
  return absl::OkStatus();
}

}  // namespace moesh
