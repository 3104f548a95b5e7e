// DeepSeek-V4 on the CUDA model (common/model/v4_model.cc is the CPU
// reference, whose cache row layout the device cache shares). Per layer, for
// the T tokens of a pass:
//   x [T, hc, hidden] fp32 → fn GEMM (fp32) → mHC pre (collapse) → RMSNorm →
//   one GEMM [wq_a | the cache row's projections | index weights] →
//   q_norm → wq_b → per-head RMSNorm + RoPE; the row's kv norm + RoPE and its
//   cache write; (CSA) the index query; (CSA, HCA) the compressed entries of
//   every segment, (CSA) the indexer's top-k; attention with sinks over the
//   window and the entries, inverse RoPE → wo_a (per group) → wo_b → y →
//   mHC post into x; the same mHC pair around the MoE, whose shared and
//   routed experts accumulate into y.
// The head collapses each sequence's last row with the hc head, then norm.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/cuda_backend/cuda_model.h"
#include "common/model/v4_model.h"
#include "kernels/cuda/dsa_ops.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/v4_ops.h"

namespace moesh::cuda {
namespace {

absl::Status UploadRope(const ModelConfig& c, const RopeConfig& r, DeviceBuffer<float>* inv_freq,
                        RopeTableView* view) {
  const cpu::RopeTable table = V4RopeTable(r, c.qk_rope_head_dim);
  RETURN_IF_ERROR(inv_freq->Reallocate(table.inv_freq.size()));
  RETURN_IF_ERROR(inv_freq->CopyFrom(table.inv_freq));
  view->inv_freq = inv_freq->get();
  view->attention_factor = table.attention_factor;
  view->dim = c.qk_rope_head_dim;
  view->layout = RopeLayout::kInterleaved;
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaModel::InitV4() {
  const ModelConfig& c = config_;
  v4_ = std::make_unique<V4State>();
  V4State& v = *v4_;
  const size_t t = max_tokens_, segs = max_rows_;
  const size_t h = c.hidden_size, hc = c.hc_mult, heads = c.num_attention_heads, d = c.head_dim;
  const size_t di = c.index_head_dim;
  size_t a_width = 0;
  int min_rate = 0;
  bool csa = false;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    a_width = std::max<size_t>(a_width, weights_->layer(l).v4.a_width);
    const int rate = c.CompressRate(l);
    if (rate > 0) min_rate = min_rate == 0 ? rate : std::min(min_rate, rate);
    csa = csa || c.layer_types[l] == V4AttentionType::kCompressedSparse;
  }
  v.min_rate = min_rate;
  // 8-aligned rows: the tuned path copies entries 16 bytes at a time.
  v.entry_width =
      min_rate > 0 ? (static_cast<int>(d) + (csa ? static_cast<int>(di) : 0) + 7) / 8 * 8 : 8;
  RETURN_IF_ERROR(v.mix.Reallocate(t * (2 + hc) * hc));
  RETURN_IF_ERROR(v.post.Reallocate(t * hc));
  RETURN_IF_ERROR(v.comb.Reallocate(t * hc * hc));
  RETURN_IF_ERROR(v.collapsed.Reallocate(t * h));
  RETURN_IF_ERROR(v.y.Reallocate(t * h));
  RETURN_IF_ERROR(v.a.Reallocate(t * a_width));
  RETURN_IF_ERROR(v.q.Reallocate(t * heads * d));
  RETURN_IF_ERROR(v.attn.Reallocate(t * heads * d));
  RETURN_IF_ERROR(v.grouped.Reallocate(t * c.o_groups * c.o_lora_rank));
  if (csa)
    RETURN_IF_ERROR(InitIndexer(
        std::max(max_model_len_ / c.compress_rate_csa, 1)));  // an entry per rate tokens
  RETURN_IF_ERROR(v.seg_from.Reallocate(segs));
  RETURN_IF_ERROR(v.seg_last.Reallocate(segs));
  v.fast = static_cast<int>(d) == mla::kLatentDim && c.qk_rope_head_dim == mla::kRopeDim &&
           options_.mla_kernel == MlaKernel::kAuto;
  if (v.fast) {
    constexpr int kRow = mla::kLatentDim + mla::kRopeDim;
    int most = 0;  // entries a token attends to, at most
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const int rate = c.CompressRate(l);
      if (rate == 0) continue;
      most = std::max(most, c.layer_types[l] == V4AttentionType::kCompressedSparse
                                ? c.index_topk
                                : max_model_len_ / rate);
    }
    RETURN_IF_ERROR(InitMlaScratch(c.sliding_window + most, &v.keys));
    RETURN_IF_ERROR(v.q576.Reallocate(t * heads * kRow));
    // The query's last 64 values stay zero: the keys' are zero there too.
    RETURN_IF_CUDA_ERROR(cudaMemset(v.q576.get(), 0, v.q576.bytes()));
    RETURN_IF_ERROR(v.key_count.Reallocate(t));
    RETURN_IF_ERROR(v.o.Reallocate(t * heads * d));
    RETURN_IF_ERROR(v.lse.Reallocate(t * heads));
  }
  RETURN_IF_ERROR(UploadRope(c, c.rope, &v.main_inv_freq, &v.main_rope));
  return UploadRope(c, c.compress_rope, &v.compress_inv_freq, &v.compress_rope);
}

absl::Status CudaModel::EnqueueMhcPre(const float* fn, const float* base, const float* scale,
                                      const bf16* norm, int num_tokens, bool router_input) {
  const ModelConfig& c = config_;
  V4State& v = *v4_;
  cudaStream_t s = stream_.get();
  const int h = c.hidden_size, hc = c.hc_mult;
  RETURN_IF_ERROR(
      gemm_->RunF32(x_.get(), fn, v.mix.get(), num_tokens, (2 + hc) * hc, hc * h, false, s));
  MhcPreParams p;
  p.x = x_.get(), p.mix = v.mix.get(), p.base = base, p.scale = scale;
  p.num_tokens = num_tokens, p.hc = hc, p.hidden = h;
  p.sinkhorn_iters = c.hc_sinkhorn_iters, p.hc_eps = static_cast<float>(c.hc_eps);
  p.norm_eps = static_cast<float>(c.rms_norm_eps);
  p.collapsed = v.collapsed.get(), p.post = v.post.get(), p.comb = v.comb.get(), p.stream = s;
  RETURN_IF_ERROR(RunMhcPre(p));
  RmsNormF32Params np;
  np.x = v.collapsed.get(), np.weight = norm, np.num_rows = num_tokens, np.n = h;
  np.eps = static_cast<float>(c.rms_norm_eps), np.y = normed_.get(), np.stream = s;
  np.y_f32 = router_input ? normed_f32_.get() : nullptr;
  return RunRmsNormF32(np);
}

absl::Status CudaModel::EnqueueMhcPost(int num_tokens) {
  MhcPostParams p;
  p.x = x_.get(), p.y = v4_->y.get(), p.post = v4_->post.get(), p.comb = v4_->comb.get();
  p.num_tokens = num_tokens, p.hc = config_.hc_mult, p.hidden = config_.hidden_size,
  p.stream = stream_.get();
  return RunMhcPost(p);
}

absl::Status CudaModel::EnqueueV4Layers(const Batch& b, ExpertClient* experts) {
  const ModelConfig& c = config_;
  cudaStream_t s = stream_.get();
  const int t = b.num_tokens, h = c.hidden_size;
  EmbedParams ep;
  ep.table = weights_->embed(), ep.token_ids = d_tokens_.get(), ep.num_tokens = t, ep.hidden = h;
  ep.copies = c.hc_mult, ep.out = x_.get(), ep.stream = s;
  RETURN_IF_ERROR(RunEmbed(ep));
  RETURN_IF_ERROR(Mark(1));
  routing_rows_ = t;
  dispatch_tokens_ = b.real_tokens >= 0 ? b.real_tokens : t;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const DeviceLayerWeights& w = weights_->layer(l);
    RETURN_IF_ERROR(EnqueueMhcPre(w.v4.hc_attn_fn, w.v4.hc_attn_base, w.v4.hc_attn_scale,
                                  w.input_norm, t, false));
    RETURN_IF_ERROR(EnqueueV4Attention(b, l));
    RETURN_IF_ERROR(EnqueueMhcPost(t));
    RETURN_IF_ERROR(Mark(2 + 2 * l));
    RETURN_IF_ERROR(
        EnqueueMhcPre(w.v4.hc_ffn_fn, w.v4.hc_ffn_base, w.v4.hc_ffn_scale, w.post_norm, t, true));
    RETURN_IF_CUDA_ERROR(
        cudaMemsetAsync(v4_->y.get(), 0, static_cast<size_t>(t) * h * sizeof(float), s));
    RETURN_IF_ERROR(EnqueueMoe(l, t, experts));
    RETURN_IF_ERROR(EnqueueMhcPost(t));
    RETURN_IF_ERROR(Mark(3 + 2 * l));
  }
  return absl::OkStatus();
}

absl::Status CudaModel::EnqueueV4Attention(const Batch& b, int l) {
  const ModelConfig& c = config_;
  V4State& v = *v4_;
  const DeviceLayerWeights::V4& w = weights_->layer(l).v4;
  cudaStream_t s = stream_.get();
  const int t = b.num_tokens, h = c.hidden_size, heads = c.num_attention_heads, d = c.head_dim;
  const int qr = c.q_lora_rank, ni = c.index_n_heads, di = c.index_head_dim;
  const int rate = c.CompressRate(l), a = w.a_width;
  const V4AttentionType type = c.layer_types[l];
  const bool csa = type == V4AttentionType::kCompressedSparse;
  const RopeTableView& rope = type == V4AttentionType::kSliding ? v.main_rope : v.compress_rope;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int num_segs = static_cast<int>(b.seg_last.size());

  RETURN_IF_ERROR(Gemm(normed_.get(), h, w.a, v.a.get(), a, t, a, h, OutType::kBf16, false));
  RmsNormParams qn;
  qn.x = v.a.get(), qn.weight = w.q_norm, qn.y = qa_.get();
  qn.rows = t, qn.n = qr, qn.ldx = a, qn.ldy = qr, qn.eps = eps, qn.stream = s;
  RETURN_IF_ERROR(RunRmsNorm(qn));
  RETURN_IF_ERROR(
      Gemm(qa_.get(), qr, w.wq_b, v.q.get(), heads * d, t, heads * d, qr, OutType::kBf16, false));
  V4HeadsParams hp;
  hp.x = v.q.get(), hp.ldx = heads * d, hp.num_tokens = t, hp.num_heads = heads, hp.dim = d;
  hp.normalize = true, hp.eps = eps, hp.seq_lens = d_seq_lens_.get(), hp.rope = rope, hp.stream = s;
  RETURN_IF_ERROR(RunV4Heads(hp));
  V4KvRowParams kp;
  kp.src = v.a.get() + qr, kp.ld_src = a, kp.num_tokens = t, kp.width = w.row_width,
  kp.head_dim = d;
  kp.kv_norm = w.kv_norm, kp.eps = eps, kp.seq_lens = d_seq_lens_.get(),
  kp.slot_mapping = d_slots_.get();
  kp.cache = kv_->layer(l), kp.row_width = kv_->row_width(), kp.rope = rope, kp.stream = s;
  RETURN_IF_ERROR(RunV4KvRow(kp));

  if (rate > 0) RETURN_IF_ERROR(EnqueueV4Compress(l, num_segs, t / rate + 1));
  V4AttentionParams ap;
  if (rate > 0) ap.keys = csa ? V4Keys::kSelectedEntries : V4Keys::kAllEntries;
  if (csa) {
    RETURN_IF_ERROR(Gemm(qa_.get(), qr, weights_->layer(l).index_wq_b, index_q_.get(), ni * di, t,
                         ni * di, qr, OutType::kBf16, false));
    V4HeadsParams ip = hp;
    ip.x = index_q_.get(), ip.ldx = ni * di, ip.num_heads = ni, ip.dim = di, ip.normalize = false;
    ip.rope = v.compress_rope;
    RETURN_IF_ERROR(RunV4Heads(ip));
    IndexerParams xp;
    xp.q = index_q_.get(), xp.w = v.a.get() + qr + w.row_width, xp.ldw = a;
    xp.w_scale = 1.0f / std::sqrt(static_cast<float>(ni)),
    xp.scale = 1.0f / std::sqrt(static_cast<float>(di));
    xp.num_tokens = t, xp.num_heads = ni, xp.head_dim = di, xp.rate = rate, xp.top_k = c.index_topk;
    xp.seq_lens = d_seq_lens_.get();
    xp.key_cache = v.entries->layer(l), xp.key_row_width = v.entry_width, xp.key_offset = d;
    xp.block_table = d_block_table_.get(), xp.max_blocks_per_seq = max_blocks_per_seq_;
    xp.scores = index_scores_.get(), xp.max_keys = index_max_keys_;
    xp.selected = index_selected_.get(), xp.count = index_count_.get(), xp.stream = s;
    RETURN_IF_ERROR(RunIndexer(xp));
  }
  ap.q = v.q.get(), ap.num_tokens = t, ap.num_heads = heads, ap.dim = d;
  ap.cache = kv_->layer(l), ap.row_width = kv_->row_width();
  ap.block_table = d_block_table_.get(), ap.max_blocks_per_seq = max_blocks_per_seq_;
  ap.seq_lens = d_seq_lens_.get(), ap.window = c.sliding_window;
  ap.entries = rate > 0 ? v.entries->layer(l) : nullptr, ap.entry_row_width = v.entry_width;
  ap.rate = std::max(rate, 1), ap.selected = index_selected_.get(), ap.count = index_count_.get();
  ap.top_k = c.index_topk;
  ap.sinks = w.sinks, ap.scale = 1.0f / std::sqrt(static_cast<float>(d)), ap.rope = rope;
  ap.out = v.attn.get(), ap.stream = s;
  if (v.fast) {
    RETURN_IF_ERROR(EnqueueV4FastAttention(ap));
  } else {
    RETURN_IF_ERROR(RunV4Attention(ap));
  }

  // Grouped output projection: each group of heads to o_lora_rank, then mixed.
  const int groups = c.o_groups, r = c.o_lora_rank, in_g = heads * d / groups;
  BatchedGemmParams gb;
  gb.x = v.attn.get(), gb.ldx = heads * d, gb.stride_x = in_g;
  gb.w = w.wo_a, gb.ldw = in_g, gb.stride_w = static_cast<int64_t>(r) * in_g;
  gb.y = v.grouped.get(), gb.ldy = groups * r, gb.stride_y = r;
  gb.batch = groups, gb.m = t, gb.n = r, gb.k = in_g, gb.out_type = OutType::kBf16, gb.stream = s;
  RETURN_IF_ERROR(gemm_->RunBatched(gb));
  return Gemm(v.grouped.get(), groups * r, w.wo_b, v.y.get(), h, t, h, groups * r,
              OutType::kFloat32, false);
}

absl::Status CudaModel::InitV4Entries() {
  ASSIGN_OR_RETURN(v4_->entries,
                   KvPool::Create(config_.num_hidden_layers, v4_->entry_width, kv_->num_blocks()));
  return absl::OkStatus();
}

absl::Status CudaModel::EnqueueV4Compress(int l, int num_segs, int max_new) {
  const ModelConfig& c = config_;
  V4State& v = *v4_;
  const DeviceLayerWeights::V4& w = weights_->layer(l).v4;
  const int d = c.head_dim, di = c.index_head_dim, series = c.CompressSeries(l);
  V4CompressParams cp;
  cp.cache = kv_->layer(l), cp.row_width = kv_->row_width();
  cp.block_table = d_block_table_.get(), cp.max_blocks_per_seq = max_blocks_per_seq_;
  cp.seq_lens = d_seq_lens_.get(), cp.seg_row = v.seg_last.get(), cp.seg_from = v.seg_from.get();
  cp.num_segs = num_segs, cp.max_new = max_new, cp.rate = c.CompressRate(l);
  cp.eps = static_cast<float>(c.rms_norm_eps), cp.rope = v.compress_rope, cp.stream = stream_.get();
  cp.entries = v.entries->layer(l), cp.entry_row_width = v.entry_width;
  cp.kv_offset = d, cp.gate_offset = d + series * d, cp.series = series, cp.dim = d;
  cp.ape = w.comp_ape, cp.norm = w.comp_norm, cp.entry_offset = 0;
  RETURN_IF_ERROR(RunV4Compress(cp));
  if (series != 2) return absl::OkStatus();
  cp.kv_offset = d + 2 * series * d, cp.gate_offset = cp.kv_offset + 2 * di, cp.series = 2,
  cp.dim = di;
  cp.ape = w.index_ape, cp.norm = w.index_norm, cp.entry_offset = d;
  return RunV4Compress(cp);
}

absl::Status CudaModel::FillV4Entries(int seq, int from, int to) {
  if (v4_ == nullptr || v4_->min_rate == 0 || to / v4_->min_rate <= from / v4_->min_rate)
    return absl::OkStatus();
  cudaStream_t s = stream_.get();
  // One segment: row 0 of the step inputs, which no step is using now.
  std::vector<int32_t> table(max_blocks_per_seq_, 0);
  const std::vector<int32_t>& blocks = store_->at(seq).blocks;
  std::copy(blocks.begin(), blocks.begin() + std::min<size_t>(blocks.size(), table.size()),
            table.begin());
  const int32_t zero = 0;
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(d_block_table_.get(), table.data(),
                                       table.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(d_seq_lens_.get(), &to, sizeof(int32_t), cudaMemcpyHostToDevice, s));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(v4_->seg_last.get(), &zero, sizeof(int32_t), cudaMemcpyHostToDevice, s));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(v4_->seg_from.get(), &from, sizeof(int32_t), cudaMemcpyHostToDevice, s));
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    const int rate = config_.CompressRate(l);
    if (rate > 0) RETURN_IF_ERROR(EnqueueV4Compress(l, 1, (to - from) / rate + 1));
  }
  return stream_.Synchronize();
}

absl::Status CudaModel::EnqueueV4FastAttention(const V4AttentionParams& ap) {
  constexpr int kRow = mla::kLatentDim + mla::kRopeDim;
  V4State& v = *v4_;
  cudaStream_t s = stream_.get();
  const int t = ap.num_tokens, heads = ap.num_heads, d = ap.dim;
  SliceCopyParams sc;
  sc.src = ap.q, sc.src_token_stride = heads * d, sc.src_row_stride = d, sc.src_offset = 0;
  sc.dst = v.q576.get(), sc.dst_token_stride = heads * kRow, sc.dst_row_stride = kRow,
  sc.dst_offset = 0;
  sc.num_tokens = t, sc.num_rows = heads, sc.dim = d, sc.stream = s;
  RETURN_IF_ERROR(RunSliceCopy(sc));
  for (int first = 0; first < t; first += v.keys.tokens) {
    const int n = std::min(v.keys.tokens, t - first);
    RETURN_IF_ERROR(
        RunV4GatherKeys(ap, first, n, v.keys.stride, kRow, v.keys.rows.get(), v.key_count.get()));
    MlaDecodeParams mp;
    mp.q = v.q576.get() + static_cast<size_t>(first) * heads * kRow,
    mp.seq_lens = v.key_count.get() + first;
    mp.num_heads = heads, mp.softmax_scale = ap.scale;
    mp.out = v.o.get() + static_cast<size_t>(first) * heads * d, mp.out_type = OutType::kFloat32;
    mp.lse = v.lse.get() + static_cast<size_t>(first) * heads;
    RETURN_IF_ERROR(RunMlaOnScratch(v.keys, n, mp));
  }
  V4AttnFinishParams fp;
  fp.o = v.o.get(), fp.lse = v.lse.get(), fp.sinks = ap.sinks, fp.seq_lens = ap.seq_lens;
  fp.num_tokens = t, fp.num_heads = heads, fp.dim = d, fp.rope = ap.rope, fp.out = ap.out,
  fp.stream = s;
  return RunV4AttnFinish(fp);
}

absl::Status CudaModel::EnqueueV4Head(int num_tokens, int num_rows) {
  const ModelConfig& c = config_;
  V4State& v = *v4_;
  cudaStream_t s = stream_.get();
  const int h = c.hidden_size, hc = c.hc_mult;
  RETURN_IF_ERROR(gemm_->RunF32(x_.get(), weights_->hc_head_fn(), v.mix.get(), num_tokens, hc,
                                hc * h, false, s));
  MhcPreParams p;
  p.x = x_.get(), p.mix = v.mix.get(), p.rows = d_head_rows_.get();
  p.base = weights_->hc_head_base(), p.scale = weights_->hc_head_scale();
  p.num_tokens = num_rows, p.hc = hc, p.hidden = h, p.head = true;
  p.hc_eps = static_cast<float>(c.hc_eps), p.norm_eps = static_cast<float>(c.rms_norm_eps);
  p.collapsed = v.collapsed.get(), p.stream = s;
  RETURN_IF_ERROR(RunMhcPre(p));
  RmsNormF32Params np;
  np.x = v.collapsed.get(), np.weight = weights_->norm(), np.num_rows = num_rows, np.n = h;
  np.eps = static_cast<float>(c.rms_norm_eps), np.y = head_normed_.get(), np.stream = s;
  return RunRmsNormF32(np);
}

}  // namespace moesh::cuda
