#include "common/cuda_backend/v4/v4_layer_stack.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/model/v4/v4_model.h"
#include "kernels/cuda/dsa_ops.h"
#include "kernels/cuda/fill.h"
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

absl::Status V4LayerStack::Init() {
  const ModelConfig& c = ctx_.config;
  const size_t t = ctx_.max_tokens;
  const size_t h = c.hidden_size, hc = c.v4.hc_mult, heads = c.num_attention_heads,
               d = c.v4.head_dim;
  const size_t di = c.indexer.head_dim;
  size_t a_width = 0;
  int min_rate = 0;
  bool csa = false;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    a_width = std::max<size_t>(a_width, ctx_.weights->layer(l).v4.a_width);
    const int rate = c.v4.CompressRate(l);
    if (rate > 0) min_rate = min_rate == 0 ? rate : std::min(min_rate, rate);
    csa = csa || c.v4.layer_types[l] == V4AttentionType::kCompressedSparse;
  }
  min_rate_ = min_rate;
  // 8-aligned rows: the tuned path copies entries 16 bytes at a time.
  entry_width_ =
      min_rate > 0 ? (static_cast<int>(d) + (csa ? static_cast<int>(di) : 0) + 7) / 8 * 8 : 8;
  RETURN_IF_ERROR(x_.Reallocate(t * h * hc));
  RETURN_IF_ERROR(normed_.Reallocate(t * h));
  RETURN_IF_ERROR(normed_f32_.Reallocate(t * h));
  RETURN_IF_ERROR(qa_.Reallocate(t * std::max(c.q_lora_rank, 1)));
  RETURN_IF_ERROR(mix_.Reallocate(t * (2 + hc) * hc));
  RETURN_IF_ERROR(post_.Reallocate(t * hc));
  RETURN_IF_ERROR(comb_.Reallocate(t * hc * hc));
  RETURN_IF_ERROR(collapsed_.Reallocate(t * h));
  RETURN_IF_ERROR(y_.Reallocate(t * h));
  RETURN_IF_ERROR(a_.Reallocate(t * a_width));
  RETURN_IF_ERROR(q_.Reallocate(t * heads * d));
  RETURN_IF_ERROR(attn_.Reallocate(t * heads * d));
  RETURN_IF_ERROR(grouped_.Reallocate(t * c.v4.o_groups * c.v4.o_lora_rank));
  if (csa) {  // an entry per rate tokens
    RETURN_IF_ERROR(index_.Init(ctx_, std::max(ctx_.max_model_len / c.v4.compress_rate_csa, 1)));
  }
  fast_ = static_cast<int>(d) == mla::kLatentDim && c.qk_rope_head_dim == mla::kRopeDim &&
          ctx_.options.mla_kernel != MlaKernel::kGeneric;
  if (fast_) {
    constexpr int kRow = mla::kLatentDim + mla::kRopeDim;
    int most = 0;  // entries a token attends to, at most
    for (int l = 0; l < c.num_hidden_layers; ++l) {
      const int rate = c.v4.CompressRate(l);
      if (rate == 0) continue;
      most = std::max(most, c.v4.layer_types[l] == V4AttentionType::kCompressedSparse
                                ? c.indexer.topk
                                : ctx_.max_model_len / rate);
    }
    RETURN_IF_ERROR(keys_.Init(ctx_, c.v4.sliding_window + most));
    RETURN_IF_ERROR(q576_.Reallocate(t * heads * kRow));
    // The query's last 64 values stay zero: the keys' are zero there too.
    RETURN_IF_CUDA_ERROR(cudaMemset(q576_.get(), 0, q576_.bytes()));
    RETURN_IF_ERROR(key_count_.Reallocate(t));
    RETURN_IF_ERROR(o_.Reallocate(t * heads * d));
    RETURN_IF_ERROR(lse_.Reallocate(t * heads));
  }
  RETURN_IF_ERROR(UploadRope(c, c.rope, &main_inv_freq_, &main_rope_));
  return UploadRope(c, c.v4.compress_rope, &compress_inv_freq_, &compress_rope_);
}

absl::Status V4LayerStack::EnqueueMhcPre(const float* fn, const float* base, const float* scale,
                                         const bf16* norm, int num_tokens, bool router_input) {
  const ModelConfig& c = ctx_.config;
  cudaStream_t s = ctx_.stream;
  const int h = c.hidden_size, hc = c.v4.hc_mult;
  RETURN_IF_ERROR(
      ctx_.gemm->RunF32(x_.get(), fn, mix_.get(), num_tokens, (2 + hc) * hc, hc * h, false, s));
  MhcPreParams p;
  p.x = x_.get(), p.mix = mix_.get(), p.base = base, p.scale = scale;
  p.num_tokens = num_tokens, p.hc = hc, p.hidden = h;
  p.sinkhorn_iters = c.v4.hc_sinkhorn_iters, p.hc_eps = static_cast<float>(c.v4.hc_eps);
  p.norm_eps = static_cast<float>(c.rms_norm_eps);
  p.collapsed = collapsed_.get(), p.post = post_.get(), p.comb = comb_.get(), p.stream = s;
  RETURN_IF_ERROR(RunMhcPre(p));
  RmsNormF32Params np;
  np.x = collapsed_.get(), np.weight = norm, np.num_rows = num_tokens, np.n = h;
  np.eps = static_cast<float>(c.rms_norm_eps), np.y = normed_.get(), np.stream = s;
  np.y_f32 = router_input ? normed_f32_.get() : nullptr;
  return RunRmsNormF32(np);
}

absl::Status V4LayerStack::EnqueueMhcPost(int num_tokens) {
  const ModelConfig& c = ctx_.config;
  MhcPostParams p;
  p.x = x_.get(), p.y = y_.get(), p.post = post_.get(), p.comb = comb_.get();
  p.num_tokens = num_tokens, p.hc = c.v4.hc_mult, p.hidden = c.hidden_size, p.stream = ctx_.stream;
  return RunMhcPost(p);
}

absl::Status V4LayerStack::Enqueue(const StepBatch& b, ExpertClient* experts) {
  const ModelConfig& c = ctx_.config;
  cudaStream_t s = ctx_.stream;
  const int t = b.num_tokens, h = c.hidden_size;
  EmbedParams ep;
  ep.table = ctx_.weights->embed(), ep.token_ids = ctx_.in->tokens, ep.num_tokens = t,
  ep.hidden = h;
  ep.copies = c.v4.hc_mult, ep.out = x_.get(), ep.stream = s;
  RETURN_IF_ERROR(RunEmbed(ep));
  RETURN_IF_ERROR(ctx_.Mark(1));
  ffn_->BeginPass(t, b.real_tokens >= 0 ? b.real_tokens : t);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const DeviceLayerWeights& w = ctx_.weights->layer(l);
    RETURN_IF_ERROR(EnqueueMhcPre(w.v4.hc_attn_fn, w.v4.hc_attn_base, w.v4.hc_attn_scale,
                                  w.input_norm, t, false));
    RETURN_IF_ERROR(EnqueueAttention(b, l));
    RETURN_IF_ERROR(EnqueueMhcPost(t));
    RETURN_IF_ERROR(ctx_.Mark(2 + 2 * l));
    RETURN_IF_ERROR(
        EnqueueMhcPre(w.v4.hc_ffn_fn, w.v4.hc_ffn_base, w.v4.hc_ffn_scale, w.post_norm, t, true));
    RETURN_IF_CUDA_ERROR(
        cudaMemsetAsync(y_.get(), 0, static_cast<size_t>(t) * h * sizeof(float), s));
    RETURN_IF_ERROR(ffn_->EnqueueMoe(l, t, normed_.get(), normed_f32_.get(), y_.get(), experts));
    RETURN_IF_ERROR(EnqueueMhcPost(t));
    RETURN_IF_ERROR(ctx_.Mark(3 + 2 * l));
  }
  return absl::OkStatus();
}

absl::Status V4LayerStack::EnqueueAttention(const StepBatch& b, int l) {
  const ModelConfig& c = ctx_.config;
  const DeviceLayerWeights::V4& w = ctx_.weights->layer(l).v4;
  cudaStream_t s = ctx_.stream;
  const int t = b.num_tokens, h = c.hidden_size, heads = c.num_attention_heads, d = c.v4.head_dim;
  const int qr = c.q_lora_rank, ni = c.indexer.n_heads, di = c.indexer.head_dim;
  const int rate = c.v4.CompressRate(l), a = w.a_width;
  const V4AttentionType type = c.v4.layer_types[l];
  const bool csa = type == V4AttentionType::kCompressedSparse;
  const RopeTableView& rope = type == V4AttentionType::kSliding ? main_rope_ : compress_rope_;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const int num_segs = static_cast<int>(b.seg_last.size());

  RETURN_IF_ERROR(ctx_.Gemm(normed_.get(), h, w.a, a_.get(), a, t, a, h, OutType::kBf16, false));
  RmsNormParams qn;
  qn.x = a_.get(), qn.weight = w.q_norm, qn.y = qa_.get();
  qn.rows = t, qn.n = qr, qn.ldx = a, qn.ldy = qr, qn.eps = eps, qn.stream = s;
  RETURN_IF_ERROR(RunRmsNorm(qn));
  RETURN_IF_ERROR(ctx_.Gemm(qa_.get(), qr, w.wq_b, q_.get(), heads * d, t, heads * d, qr,
                            OutType::kBf16, false));
  V4HeadsParams hp;
  hp.x = q_.get(), hp.ldx = heads * d, hp.num_tokens = t, hp.num_heads = heads, hp.dim = d;
  hp.normalize = true, hp.eps = eps, hp.seq_lens = ctx_.in->seq_lens, hp.rope = rope, hp.stream = s;
  RETURN_IF_ERROR(RunV4Heads(hp));
  V4KvRowParams kp;
  kp.src = a_.get() + qr, kp.ld_src = a, kp.num_tokens = t, kp.width = w.row_width, kp.head_dim = d;
  kp.kv_norm = w.kv_norm, kp.eps = eps, kp.seq_lens = ctx_.in->seq_lens,
  kp.slot_mapping = ctx_.in->slots;
  kp.cache = ctx_.kv().layer(l), kp.row_width = ctx_.kv().row_stride(), kp.rope = rope,
  kp.stream = s;
  RETURN_IF_ERROR(RunV4KvRow(kp));

  if (rate > 0) RETURN_IF_ERROR(EnqueueCompress(l, num_segs, t / rate + 1));
  V4AttentionParams ap;
  if (rate > 0) ap.keys = csa ? V4Keys::kSelectedEntries : V4Keys::kAllEntries;
  if (csa) {
    RETURN_IF_ERROR(ctx_.Gemm(qa_.get(), qr, ctx_.weights->layer(l).index_wq_b, index_.q.get(),
                              ni * di, t, ni * di, qr, OutType::kBf16, false));
    V4HeadsParams ip = hp;
    ip.x = index_.q.get(), ip.ldx = ni * di, ip.num_heads = ni, ip.dim = di, ip.normalize = false;
    ip.rope = compress_rope_;
    RETURN_IF_ERROR(RunV4Heads(ip));
    IndexerParams xp;
    xp.q = index_.q.get(), xp.w = a_.get() + qr + w.row_width, xp.ldw = a;
    xp.w_scale = 1.0f / std::sqrt(static_cast<float>(ni)),
    xp.scale = 1.0f / std::sqrt(static_cast<float>(di));
    xp.num_tokens = t, xp.num_heads = ni, xp.head_dim = di, xp.rate = rate,
    xp.top_k = c.indexer.topk;
    xp.seq_lens = ctx_.in->seq_lens;
    xp.key_cache = entries_->layer(l), xp.key_row_width = entry_width_, xp.key_offset = d;
    xp.block_table = ctx_.in->block_table, xp.max_blocks_per_seq = ctx_.max_blocks_per_seq();
    xp.scores = index_.scores.get(), xp.max_keys = index_.max_keys;
    xp.selected = index_.selected.get(), xp.count = index_.count.get(), xp.stream = s;
    // The tensor-core scores where the shape and the key rows allow them.
    xp.tensor_cores = ctx_.options.indexer_tensor_cores && xp.num_heads == 64 &&
                      xp.head_dim == 128 && xp.key_row_width % 8 == 0 && xp.key_offset % 8 == 0;
    RETURN_IF_ERROR(RunIndexer(xp));
  }
  ap.q = q_.get(), ap.num_tokens = t, ap.num_heads = heads, ap.dim = d;
  ap.cache = ctx_.kv().layer(l), ap.row_width = ctx_.kv().row_stride();
  ap.block_table = ctx_.in->block_table, ap.max_blocks_per_seq = ctx_.max_blocks_per_seq();
  ap.seq_lens = ctx_.in->seq_lens, ap.window = c.v4.sliding_window;
  ap.entries = rate > 0 ? entries_->layer(l) : nullptr, ap.entry_row_width = entry_width_;
  ap.rate = std::max(rate, 1), ap.selected = index_.selected.get(), ap.count = index_.count.get();
  ap.top_k = c.indexer.topk;
  ap.sinks = w.sinks, ap.scale = 1.0f / std::sqrt(static_cast<float>(d)), ap.rope = rope;
  ap.out = attn_.get(), ap.stream = s;
  if (fast_) {
    RETURN_IF_ERROR(EnqueueFastAttention(ap));
  } else {
    RETURN_IF_ERROR(RunV4Attention(ap));
  }

  // Grouped output projection: each group of heads to o_lora_rank, then mixed.
  const int groups = c.v4.o_groups, r = c.v4.o_lora_rank, in_g = heads * d / groups;
  BatchedGemmParams gb;
  gb.x = attn_.get(), gb.ldx = heads * d, gb.stride_x = in_g;
  gb.w = w.wo_a, gb.ldw = in_g, gb.stride_w = static_cast<int64_t>(r) * in_g;
  gb.y = grouped_.get(), gb.ldy = groups * r, gb.stride_y = r;
  gb.batch = groups, gb.m = t, gb.n = r, gb.k = in_g, gb.out_type = OutType::kBf16, gb.stream = s;
  RETURN_IF_ERROR(ctx_.gemm->RunBatched(gb));
  return ctx_.Gemm(grouped_.get(), groups * r, w.wo_b, y_.get(), h, t, h, groups * r,
                   OutType::kFloat32, false);
}

size_t V4LayerStack::ExtraBlockBytes() const {
  return KvPool::BlockBytes(ctx_.config.num_hidden_layers, KvRowSpec::Bf16(entry_width_));
}

absl::Status V4LayerStack::AttachPool(int num_blocks) {
  ASSIGN_OR_RETURN(entries_, KvPool::Create(ctx_.config.num_hidden_layers,
                                            KvRowSpec::Bf16(entry_width_), num_blocks));
  return absl::OkStatus();
}

absl::Status V4LayerStack::FillCacheRandom(uint64_t seed) {
  // Normalised like the entries: about unit scale.
  return FillUniform(entries_->layer(0), entries_->bytes() / sizeof(bf16), seed, 1.0f, ctx_.stream);
}

absl::Status V4LayerStack::EnqueueCompress(int l, int num_segs, int max_new) {
  const ModelConfig& c = ctx_.config;
  const DeviceLayerWeights::V4& w = ctx_.weights->layer(l).v4;
  const int d = c.v4.head_dim, di = c.indexer.head_dim, series = c.v4.CompressSeries(l);
  V4CompressParams cp;
  cp.cache = ctx_.kv().layer(l), cp.row_width = ctx_.kv().row_stride();
  cp.block_table = ctx_.in->block_table, cp.max_blocks_per_seq = ctx_.max_blocks_per_seq();
  cp.seq_lens = ctx_.in->seq_lens, cp.seg_row = ctx_.in->seg_last, cp.seg_from = ctx_.in->seg_from;
  cp.num_segs = num_segs, cp.max_new = max_new, cp.rate = c.v4.CompressRate(l);
  cp.eps = static_cast<float>(c.rms_norm_eps), cp.rope = compress_rope_, cp.stream = ctx_.stream;
  cp.entries = entries_->layer(l), cp.entry_row_width = entry_width_;
  cp.kv_offset = d, cp.gate_offset = d + series * d, cp.series = series, cp.dim = d;
  cp.ape = w.comp_ape, cp.norm = w.comp_norm, cp.entry_offset = 0;
  RETURN_IF_ERROR(RunV4Compress(cp));
  if (series != 2) return absl::OkStatus();
  cp.kv_offset = d + 2 * series * d, cp.gate_offset = cp.kv_offset + 2 * di, cp.series = 2,
  cp.dim = di;
  cp.ape = w.index_ape, cp.norm = w.index_norm, cp.entry_offset = d;
  return RunV4Compress(cp);
}

absl::Status V4LayerStack::RowsArrived(int seq, int from, int to) {
  if (min_rate_ == 0 || to / min_rate_ <= from / min_rate_) return absl::OkStatus();
  const ModelConfig& c = ctx_.config;
  cudaStream_t s = ctx_.stream;
  // One segment: row 0 of the step inputs, which no step is using now.
  std::vector<int32_t> table(ctx_.max_blocks_per_seq(), 0);
  const std::vector<int32_t>& blocks = ctx_.store->at(seq).blocks;
  std::copy(blocks.begin(), blocks.begin() + std::min<size_t>(blocks.size(), table.size()),
            table.begin());
  const int32_t zero = 0;
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(ctx_.in->block_table, table.data(),
                                       table.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(ctx_.in->seq_lens, &to, sizeof(int32_t), cudaMemcpyHostToDevice, s));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(ctx_.in->seg_last, &zero, sizeof(int32_t), cudaMemcpyHostToDevice, s));
  RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(ctx_.in->seg_from, &from, sizeof(int32_t), cudaMemcpyHostToDevice, s));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const int rate = c.v4.CompressRate(l);
    if (rate > 0) RETURN_IF_ERROR(EnqueueCompress(l, 1, (to - from) / rate + 1));
  }
  return CudaStatus(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

absl::Status V4LayerStack::EnqueueFastAttention(const V4AttentionParams& ap) {
  constexpr int kRow = mla::kLatentDim + mla::kRopeDim;
  cudaStream_t s = ctx_.stream;
  const int t = ap.num_tokens, heads = ap.num_heads, d = ap.dim;
  SliceCopyParams sc;
  sc.src = ap.q, sc.src_token_stride = heads * d, sc.src_row_stride = d, sc.src_offset = 0;
  sc.dst = q576_.get(), sc.dst_token_stride = heads * kRow, sc.dst_row_stride = kRow,
  sc.dst_offset = 0;
  sc.num_tokens = t, sc.num_rows = heads, sc.dim = d, sc.stream = s;
  RETURN_IF_ERROR(RunSliceCopy(sc));
  for (int first = 0; first < t; first += keys_.tokens) {
    const int n = std::min(keys_.tokens, t - first);
    RETURN_IF_ERROR(
        RunV4GatherKeys(ap, first, n, keys_.stride, kRow, keys_.rows.get(), key_count_.get()));
    MlaDecodeParams mp;
    mp.q = q576_.get() + static_cast<size_t>(first) * heads * kRow,
    mp.seq_lens = key_count_.get() + first;
    mp.num_heads = heads, mp.softmax_scale = ap.scale;
    mp.out = o_.get() + static_cast<size_t>(first) * heads * d, mp.out_type = OutType::kFloat32;
    mp.lse = lse_.get() + static_cast<size_t>(first) * heads;
    RETURN_IF_ERROR(keys_.Run(ctx_, n, mp));
  }
  V4AttnFinishParams fp;
  fp.o = o_.get(), fp.lse = lse_.get(), fp.sinks = ap.sinks, fp.seq_lens = ap.seq_lens;
  fp.num_tokens = t, fp.num_heads = heads, fp.dim = d, fp.rope = ap.rope, fp.out = ap.out,
  fp.stream = s;
  return RunV4AttnFinish(fp);
}

absl::Status V4LayerStack::EnqueueFinalNorm(int num_tokens, int num_rows, const int32_t* rows,
                                            bf16* out) {
  const ModelConfig& c = ctx_.config;
  cudaStream_t s = ctx_.stream;
  const int h = c.hidden_size, hc = c.v4.hc_mult;
  RETURN_IF_ERROR(ctx_.gemm->RunF32(x_.get(), ctx_.weights->hc_head_fn(), mix_.get(), num_tokens,
                                    hc, hc * h, false, s));
  MhcPreParams p;
  p.x = x_.get(), p.mix = mix_.get(), p.rows = rows;
  p.base = ctx_.weights->hc_head_base(), p.scale = ctx_.weights->hc_head_scale();
  p.num_tokens = num_rows, p.hc = hc, p.hidden = h, p.head = true;
  p.hc_eps = static_cast<float>(c.v4.hc_eps), p.norm_eps = static_cast<float>(c.rms_norm_eps);
  p.collapsed = collapsed_.get(), p.stream = s;
  RETURN_IF_ERROR(RunMhcPre(p));
  RmsNormF32Params np;
  np.x = collapsed_.get(), np.weight = ctx_.weights->norm(), np.num_rows = num_rows, np.n = h;
  np.eps = static_cast<float>(c.rms_norm_eps), np.y = out, np.stream = s;
  return RunRmsNormF32(np);
}

}  // namespace moesh::cuda
