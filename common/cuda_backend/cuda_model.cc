#include "common/cuda_backend/cuda_model.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/model/attention_model.h"
#include "common/model/safetensors.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/expert_mlp.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/routing.h"

namespace moesh::cuda {
namespace {

// q_a_layernorm and kv_a_layernorm are built without the config's eps
// (common/model/attention_model.cc).
constexpr float kLatentNormEps = 1e-6f;
// Memory left out of the KV cache's share for cuBLAS, graphs and the runtime.
constexpr size_t kReserveBytes = size_t{768} << 20;

GateSelect SelectOf(TopkMethod m) {
  switch (m) {
    case TopkMethod::kGreedy:
      return GateSelect::kGreedy;
    case TopkMethod::kGroupLimitedGreedy:
      return GateSelect::kGroupMax;
    case TopkMethod::kNoauxTc:
      return GateSelect::kGroupTop2Sum;
  }
  return GateSelect::kGreedy;
}

}  // namespace

CudaModel::CudaModel(const ModelConfig& config, const CudaModelOptions& options)
    : config_(config), options_(options) {}

CudaModel::~CudaModel() {
  graphs_.reset();
  if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Load(const std::string& dir,
                                                           const CudaModelOptions& options) {
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  RETURN_IF_ERROR(ValidateCheckpoint(config, *ckpt));
  ASSIGN_OR_RETURN(std::unique_ptr<AttentionWeights> attention,
                   AttentionWeights::Load(config, *ckpt));
  std::unique_ptr<ExpertShardWeights> experts;
  if (options.routed_experts_on_device) {
    ASSIGN_OR_RETURN(experts, ExpertShardWeights::Load(config, *ckpt, {}));
  }
  return FromHost(config, *attention, experts.get(), options);
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::FromHost(const ModelConfig& config,
                                                               const AttentionWeights& attention,
                                                               const ExpertShardWeights* experts,
                                                               const CudaModelOptions& options) {
  if (options.routed_experts_on_device && experts == nullptr) {
    return absl::InvalidArgumentError(
        "CudaModel::FromHost: routed_experts_on_device needs the experts");
  }
  ASSIGN_OR_RETURN(Stream stream, Stream::Create());
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceWeights> w,
                   DeviceWeights::FromHost(config, attention,
                                           options.routed_experts_on_device ? experts : nullptr));
  return Create(config, options, std::move(w), std::move(stream));
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Dummy(const ModelConfig& config,
                                                            uint64_t seed,
                                                            const CudaModelOptions& options) {
  ASSIGN_OR_RETURN(Stream stream, Stream::Create());
  ASSIGN_OR_RETURN(
      std::unique_ptr<DeviceWeights> w,
      DeviceWeights::Dummy(config, seed, stream.get(), options.routed_experts_on_device));
  return Create(config, options, std::move(w), std::move(stream));
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const ModelConfig& config,
                                                             const CudaModelOptions& options,
                                                             std::unique_ptr<DeviceWeights> weights,
                                                             Stream stream) {
  std::unique_ptr<CudaModel> m(new CudaModel(config, options));
  m->weights_ = std::move(weights);
  m->stream_ = std::move(stream);
  m->graphs_ = std::make_unique<GraphRunner>(m->stream_.get());
  RETURN_IF_ERROR(m->Init());
  return m;
}

absl::Status CudaModel::Init() {
  const ModelConfig& c = config_;
  const CudaModelOptions& o = options_;
  if (o.moe_tile_m != 0 && o.moe_tile_m != 16 && o.moe_tile_m != 32 && o.moe_tile_m != 64) {
    return absl::InvalidArgumentError("CudaModel: moe_tile_m must be 0, 16, 32 or 64");
  }
  if (o.max_num_seqs < 1 || o.max_num_seqs > 65535 || o.max_tokens_per_step < 1 ||
      o.max_model_len < 0 || !(o.gpu_memory_utilization > 0.0 && o.gpu_memory_utilization <= 1.0)) {
    return absl::InvalidArgumentError(
        "CudaModel: need 1 <= max_num_seqs <= 65535, max_tokens_per_step >= 1, max_model_len >= 0, "
        "0 < gpu_memory_utilization <= 1");
  }
  if (c.n_routed_experts > 1024 || c.num_experts_per_tok > 32) {
    return absl::UnimplementedError("CudaModel: at most 1024 routed experts and top-32");
  }
  ASSIGN_OR_RETURN(info_, CurrentDeviceInfo());
  ASSIGN_OR_RETURN(gemm_, CublasGemm::Create());
  const int pos_limit = c.max_position_embeddings > 0 ? c.max_position_embeddings : 1 << 30;
  max_model_len_ = o.max_model_len > 0 ? o.max_model_len : std::min(pos_limit, 8192);
  if (max_model_len_ > pos_limit) {
    return absl::InvalidArgumentError(absl::StrCat("CudaModel: max_model_len ", max_model_len_,
                                                   " exceeds max_position_embeddings ", pos_limit));
  }
  if (c.has_indexer() && c.q_lora_rank <= 0) {
    return absl::InvalidArgumentError("CudaModel: DeepSeek-V3.2's indexer needs q_lora_rank > 0");
  }
  max_blocks_per_seq_ = (max_model_len_ + kKvBlockSize - 1) / kKvBlockSize;
  max_rows_ = o.max_num_seqs;
  max_tokens_ = std::max(o.max_tokens_per_step, o.max_num_seqs);
  for (int b = 1; b < o.max_num_seqs; b *= 2) buckets_.push_back(b);
  buckets_.push_back(o.max_num_seqs);

  const int h = c.hidden_size, heads = c.num_attention_heads, qk = c.qk_head_dim();
  const int rank = c.kv_lora_rank, rope = c.qk_rope_head_dim, v = c.v_head_dim;
  // V3.2 attends to the indexer's selection: the generic kernel, which reads a row index.
  fast_mla_ = rank == mla::kLatentDim && rope == mla::kRopeDim &&
              o.mla_kernel == MlaKernel::kAuto && !c.has_indexer();
  softmax_scale_ = static_cast<float>(c.SoftmaxScale());
  const cpu::RopeTable table = MakeRopeTable(c);
  RETURN_IF_ERROR(inv_freq_.Reallocate(table.inv_freq.size()));
  RETURN_IF_ERROR(inv_freq_.CopyFrom(table.inv_freq));
  rope_.inv_freq = inv_freq_.get();
  rope_.attention_factor = table.attention_factor;
  rope_.dim = rope;
  rope_.layout = c.rope_interleave ? RopeLayout::kInterleaved : RopeLayout::kHalves;

  const size_t t = max_tokens_;
  const int qkv_w = weights_->qkv_width();
  const int mlp_inter = std::max(c.intermediate_size, weights_->shared_intermediate());
  const int e = std::max(c.n_routed_experts, 1), k = std::max(c.num_experts_per_tok, 1);
  const int moe_inter = std::max(c.moe_intermediate_size, 1);
  RETURN_IF_ERROR(x_.Reallocate(t * h * (c.is_v4() ? c.hc_mult : 1)));
  resid_ = x_.get();
  RETURN_IF_ERROR(normed_.Reallocate(t * h));
  RETURN_IF_ERROR(normed_f32_.Reallocate(t * h));
  RETURN_IF_ERROR(qkv_.Reallocate(t * qkv_w));
  RETURN_IF_ERROR(qa_.Reallocate(t * std::max(c.q_lora_rank, 1)));
  RETURN_IF_ERROR(q_.Reallocate(c.q_lora_rank > 0 ? t * heads * qk : 1));
  RETURN_IF_ERROR(q_mla_.Reallocate(t * heads * (rank + rope)));
  RETURN_IF_ERROR(o_lat_.Reallocate(t * heads * rank));
  RETURN_IF_ERROR(attn_.Reallocate(t * heads * v));
  RETURN_IF_ERROR(mlp_gu_.Reallocate(t * 2 * mlp_inter));
  RETURN_IF_ERROR(mlp_act_.Reallocate(t * mlp_inter));
  RETURN_IF_ERROR(router_logits_.Reallocate(t * e));
  RETURN_IF_ERROR(topk_ids_.Reallocate(t * k));
  RETURN_IF_ERROR(topk_w_.Reallocate(t * k));
  RETURN_IF_ERROR(row_token_.Reallocate(t * k));
  RETURN_IF_ERROR(pair_row_.Reallocate(t * k));
  RETURN_IF_ERROR(expert_offsets_.Reallocate(e + 1));
  RETURN_IF_ERROR(tile_offsets_.Reallocate(e + 1));
  RETURN_IF_ERROR(expert_counts_.Reallocate(static_cast<size_t>(c.num_hidden_layers) * e));
  RETURN_IF_CUDA_ERROR(
      cudaMemsetAsync(expert_counts_.get(), 0, expert_counts_.bytes(), stream_.get()));
  if (o.record_routing) {
    RETURN_IF_ERROR(routing_log_.Reallocate(static_cast<size_t>(c.num_hidden_layers) * t * k));
    RETURN_IF_CUDA_ERROR(
        cudaMemsetAsync(routing_log_.get(), 0xff, routing_log_.bytes(), stream_.get()));
  }
  if (o.routed_experts_on_device) {
    // kDenseRowAlign rows of slack: the per-expert dense GEMMs' last spill (expert_mlp.h).
    const size_t rows = t * k + kDenseRowAlign;
    RETURN_IF_ERROR(moe_gu_.Reallocate(rows * 2 * moe_inter));
    RETURN_IF_ERROR(moe_act_.Reallocate(rows * moe_inter));
    RETURN_IF_ERROR(moe_out_.Reallocate(rows * h));
    if (t * k >=
        static_cast<size_t>(kDenseRowsPerExpert) * e) {  // batches large enough for the dense path
      RETURN_IF_ERROR(moe_gathered_.Reallocate(rows * h));
      ASSIGN_OR_RETURN(h_expert_offsets_, PinnedBuffer<int32_t>::Create(e + 1));
    }
  } else {
    RETURN_IF_ERROR(moe_out_.Reallocate(t * h));  // the external experts' combined output
    // Decode padding rows are not dispatched: keep their (ignored) rows finite.
    RETURN_IF_CUDA_ERROR(cudaMemset(moe_out_.get(), 0, moe_out_.bytes()));
    ASSIGN_OR_RETURN(h_hidden_, PinnedBuffer<float>::Create(t * h));
    ASSIGN_OR_RETURN(h_routed_, PinnedBuffer<float>::Create(t * h));
    ASSIGN_OR_RETURN(h_topk_w_, PinnedBuffer<float>::Create(t * k));
    ASSIGN_OR_RETURN(h_topk_ids_, PinnedBuffer<int32_t>::Create(t * k));
    ASSIGN_OR_RETURN(dispatch_copied_, Event::Create());
  }
  RETURN_IF_ERROR(head_normed_.Reallocate(static_cast<size_t>(max_rows_) * h));
  RETURN_IF_ERROR(logits_.Reallocate(static_cast<size_t>(max_rows_) * c.vocab_size));
  RETURN_IF_ERROR(next_ids_.Reallocate(max_rows_));
  RETURN_IF_ERROR(d_sample_rows_.Reallocate(max_rows_));
  RETURN_IF_ERROR(next_lp_.Reallocate(max_rows_));
  RETURN_IF_ERROR(topk_out_ids_.Reallocate(static_cast<size_t>(max_rows_) * sampling::kMaxTopK));
  RETURN_IF_ERROR(topk_lp_.Reallocate(static_cast<size_t>(max_rows_) * sampling::kMaxTopK));
  RETURN_IF_ERROR(d_tokens_.Reallocate(t));
  RETURN_IF_ERROR(d_positions_.Reallocate(t));
  RETURN_IF_ERROR(d_slots_.Reallocate(t));
  RETURN_IF_ERROR(d_seq_lens_.Reallocate(t));
  RETURN_IF_ERROR(d_head_rows_.Reallocate(max_rows_));
  RETURN_IF_ERROR(d_block_table_.Reallocate(t * max_blocks_per_seq_));
  ASSIGN_OR_RETURN(h_meta_,
                   PinnedBuffer<int32_t>::Create(6 * t + max_rows_ + t * max_blocks_per_seq_));
  ASSIGN_OR_RETURN(h_ids_, PinnedBuffer<int32_t>::Create(static_cast<size_t>(max_rows_) *
                                                         (1 + sampling::kMaxTopK)));
  ASSIGN_OR_RETURN(h_lp_, PinnedBuffer<float>::Create(static_cast<size_t>(max_rows_) *
                                                      (1 + sampling::kMaxTopK)));
  if (c.is_v4()) {
    RETURN_IF_ERROR(InitV4());
    resid_ = v4_->y.get();
  }
  if (c.has_indexer()) {
    RETURN_IF_ERROR(InitIndexer(max_model_len_));  // every causal row is a key
    index_rope_ = rope_;
    index_rope_.layout = RopeLayout::kHalves;  // transformers' DeepseekV32Indexer rotates halves
    sparse_fast_ =
        rank == mla::kLatentDim && rope == mla::kRopeDim && o.mla_kernel == MlaKernel::kAuto;
    if (sparse_fast_) RETURN_IF_ERROR(InitSparseMla());
  }
  if (fast_mla_) {
    size_t ws = 0;
    for (int b : buckets_) {
      ws = std::max(ws, PlanMlaDecode(b, heads, max_model_len_, info_.num_sms).workspace_bytes);
    }
    RETURN_IF_ERROR(decode_ws_.Reallocate(ws));
  }

  // The KV cache: what the utilisation target leaves, up to what max_num_seqs
  // full-length sequences can use.
  size_t free_bytes = 0, total_bytes = 0;
  RETURN_IF_CUDA_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  const double budget = o.gpu_memory_utilization * static_cast<double>(total_bytes) -
                        static_cast<double>(total_bytes - free_bytes) -
                        static_cast<double>(kReserveBytes);
  const size_t block_bytes =
      KvPool::BlockBytes(c.num_hidden_layers, kv_row_width()) +
      (v4_ != nullptr ? KvPool::BlockBytes(c.num_hidden_layers, v4_->entry_width) : 0);
  int64_t blocks = budget > 0 ? static_cast<int64_t>(budget / static_cast<double>(block_bytes)) : 0;
  blocks = std::min<int64_t>(blocks, static_cast<int64_t>(o.max_num_seqs) * max_blocks_per_seq_);
  if (o.max_kv_blocks > 0) blocks = std::min<int64_t>(blocks, o.max_kv_blocks);
  if (blocks < max_blocks_per_seq_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CudaModel: the KV cache gets ", blocks, " blocks of ", block_bytes,
                     " bytes; one sequence of ", max_model_len_, " tokens needs ",
                     max_blocks_per_seq_, " (weights take ", weights_->bytes(),
                     " bytes; raise gpu_memory_utilization or lower max_model_len)"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<KvPool> pool,
                   KvPool::Create(c.num_hidden_layers, kv_row_width(), static_cast<int>(blocks)));
  store_ = std::make_unique<KvStore>(std::move(pool), max_model_len_);
  kv_ = &store_->pool();
  if (v4_ != nullptr) RETURN_IF_ERROR(InitV4Entries());
  // The weights and tables came in through synchronous copies on the legacy
  // stream, which a non-blocking stream does not wait for.
  return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

absl::Status CudaModel::Gemm(const bf16* x, int ldx, const bf16* w, void* y, int ldy, int m, int n,
                             int k, OutType out, bool accumulate) {
  GemmParams p;
  p.x = x, p.w = w, p.y = y, p.out_type = out;
  p.m = m, p.n = n, p.k = k, p.ldx = ldx, p.ldy = ldy;
  p.accumulate = accumulate;
  p.stream = stream_.get();
  return gemm_->Run(p);
}

absl::Status CudaModel::EnqueueForward(const Batch& b, bool sample, int top_k,
                                       ExpertClient* experts) {
  if (fast_mla_) {
    plan_ = PlanMlaDecode(b.num_tokens, config_.num_attention_heads, b.max_seq_len, info_.num_sms);
    if (!b.decode && plan_.workspace_bytes > prefill_ws_.bytes()) {
      RETURN_IF_ERROR(stream_.Synchronize());  // the old buffer may still be in use
      RETURN_IF_ERROR(prefill_ws_.Reallocate(plan_.workspace_bytes));
    }
  }
  RETURN_IF_ERROR(config_.is_v4() ? EnqueueV4Layers(b, experts) : EnqueueLayers(b, experts));
  if (b.num_rows > 0) RETURN_IF_ERROR(EnqueueHead(b.num_tokens, b.num_rows, sample, top_k));
  return Mark(2 + 2 * config_.num_hidden_layers);
}

absl::Status CudaModel::EnqueueLayers(const Batch& b, ExpertClient* experts) {
  const ModelConfig& c = config_;
  cudaStream_t s = stream_.get();
  const int t = b.num_tokens;
  const int h = c.hidden_size, heads = c.num_attention_heads, qk = c.qk_head_dim();
  const int rank = c.kv_lora_rank, rope = c.qk_rope_head_dim, nope = c.qk_nope_head_dim,
            v = c.v_head_dim;
  const int q_width = weights_->q_width(), qkv_w = weights_->qkv_width(), row_w = rank + rope;
  const float eps = static_cast<float>(c.rms_norm_eps);

  EmbedParams ep;
  ep.table = weights_->embed(), ep.token_ids = d_tokens_.get(), ep.num_tokens = t, ep.hidden = h;
  ep.out = x_.get(), ep.stream = s;
  RETURN_IF_ERROR(RunEmbed(ep));
  RETURN_IF_ERROR(Mark(1));
  routing_rows_ = t;
  dispatch_tokens_ = b.real_tokens >= 0 ? b.real_tokens : t;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const DeviceLayerWeights& w = weights_->layer(l);
    RmsNormF32Params np;
    np.x = x_.get(), np.weight = w.input_norm, np.num_rows = t, np.n = h, np.eps = eps;
    np.y = normed_.get(), np.stream = s;
    RETURN_IF_ERROR(RunRmsNormF32(np));
    RETURN_IF_ERROR(
        Gemm(normed_.get(), h, w.qkv_a, qkv_.get(), qkv_w, t, qkv_w, h, OutType::kBf16, false));
    const bf16* q = qkv_.get();
    int q_ld = qkv_w;
    if (c.q_lora_rank > 0) {
      RmsNormParams qn;
      qn.x = qkv_.get(), qn.weight = w.q_a_norm, qn.y = qa_.get();
      qn.rows = t, qn.n = c.q_lora_rank, qn.ldx = qkv_w, qn.ldy = c.q_lora_rank,
      qn.eps = kLatentNormEps;
      qn.stream = s;
      RETURN_IF_ERROR(RunRmsNorm(qn));
      RETURN_IF_ERROR(Gemm(qa_.get(), c.q_lora_rank, w.q_b, q_.get(), heads * qk, t, heads * qk,
                           c.q_lora_rank, OutType::kBf16, false));
      q = q_.get();
      q_ld = heads * qk;
    }
    // q_lat[t, h] = q_nope[t, h] · W_UK[h]: W_UK absorbed into the query.
    BatchedGemmParams ab;
    ab.x = q, ab.ldx = q_ld, ab.stride_x = qk;
    ab.w = w.w_uk_t, ab.ldw = nope, ab.stride_w = static_cast<int64_t>(rank) * nope;
    ab.y = q_mla_.get(), ab.ldy = heads * row_w, ab.stride_y = row_w;
    ab.batch = heads, ab.m = t, ab.n = rank, ab.k = nope, ab.out_type = OutType::kBf16,
    ab.stream = s;
    RETURN_IF_ERROR(gemm_->RunBatched(ab));
    SliceCopyParams sc;
    sc.src = q, sc.src_token_stride = q_ld, sc.src_row_stride = qk, sc.src_offset = nope;
    sc.dst = q_mla_.get(), sc.dst_token_stride = heads * row_w, sc.dst_row_stride = row_w,
    sc.dst_offset = rank;
    sc.num_tokens = t, sc.num_rows = heads, sc.dim = rope, sc.stream = s;
    RETURN_IF_ERROR(RunSliceCopy(sc));
    RopeKvCacheParams kp;
    kp.kv = qkv_.get() + q_width, kp.kv_ld = qkv_w, kp.kv_norm_weight = w.kv_a_norm,
    kp.eps = kLatentNormEps;
    kp.cache = kv_->layer(l), kp.cache_row_stride = kv_->row_width(),
    kp.num_blocks = kv_->num_blocks();
    kp.slot_mapping = d_slots_.get();
    kp.num_tokens = t, kp.kv_lora_rank = rank;
    kp.q = q_mla_.get(), kp.q_num_heads = heads, kp.q_token_stride = heads * row_w,
    kp.q_head_stride = row_w;
    kp.q_rope_offset = rank, kp.positions = d_positions_.get(), kp.rope = rope_, kp.stream = s;
    RETURN_IF_ERROR(RunRopeKvCacheWrite(kp));
    if (c.has_indexer()) RETURN_IF_ERROR(EnqueueDsaIndexer(l, t));
    MlaDecodeParams mp;
    mp.q = q_mla_.get(), mp.kv_cache = kv_->layer(l), mp.block_table = d_block_table_.get();
    mp.seq_lens = d_seq_lens_.get(), mp.batch = t, mp.num_heads = heads, mp.kv_lora_rank = rank,
    mp.rope_dim = rope;
    mp.num_blocks = kv_->num_blocks(), mp.max_blocks_per_seq = max_blocks_per_seq_,
    mp.max_seq_len = b.max_seq_len;
    mp.softmax_scale = softmax_scale_, mp.out = o_lat_.get(), mp.out_type = OutType::kBf16,
    mp.stream = s;
    mp.kv_row_stride = kv_->row_width();
    if (c.has_indexer()) {  // the indexer's selection (all causal rows up to index_topk of them)
      mp.seq_lens = index_count_.get(), mp.kv_index = index_selected_.get(),
      mp.kv_index_stride = c.index_topk;
    }
    if (sparse_fast_) {
      RETURN_IF_ERROR(EnqueueSparseMla(b, mp));
    } else if (fast_mla_) {
      mp.num_splits = plan_.num_splits;
      mp.workspace = b.decode ? decode_ws_.get() : prefill_ws_.get();
      mp.workspace_bytes = b.decode ? decode_ws_.bytes() : prefill_ws_.bytes();
      RETURN_IF_ERROR(RunMlaDecode(mp));
    } else {
      RETURN_IF_ERROR(RunMlaAttentionGeneric(mp));
    }
    // attn[t, h] = o_lat[t, h] · W_UV[h]^T, then x += attn · o_proj^T.
    BatchedGemmParams vb;
    vb.x = o_lat_.get(), vb.ldx = heads * rank, vb.stride_x = rank;
    vb.w = w.w_uv, vb.ldw = rank, vb.stride_w = static_cast<int64_t>(v) * rank;
    vb.y = attn_.get(), vb.ldy = heads * v, vb.stride_y = v;
    vb.batch = heads, vb.m = t, vb.n = v, vb.k = rank, vb.out_type = OutType::kBf16, vb.stream = s;
    RETURN_IF_ERROR(gemm_->RunBatched(vb));
    RETURN_IF_ERROR(Gemm(attn_.get(), heads * v, w.o_proj, x_.get(), h, t, h, heads * v,
                         OutType::kFloat32, true));
    RETURN_IF_ERROR(Mark(2 + 2 * l));

    np.weight = w.post_norm;
    np.y_f32 = w.is_moe ? normed_f32_.get() : nullptr;
    RETURN_IF_ERROR(RunRmsNormF32(np));
    if (w.is_moe) {
      RETURN_IF_ERROR(EnqueueMoe(l, t, experts));
    } else {
      RETURN_IF_ERROR(EnqueueMlp(w.dense_gate_up, w.dense_down, c.intermediate_size, t));
    }
    RETURN_IF_ERROR(Mark(3 + 2 * l));
  }
  return absl::OkStatus();
}

absl::Status CudaModel::Mark(int index) {
  if (profile_ == nullptr) return absl::OkStatus();
  return (*profile_)[index].Record(stream_.get());
}

absl::Status CudaModel::EnqueueMlp(const bf16* w_gate_up, const bf16* w_down, int inter,
                                   int num_tokens) {
  const int h = config_.hidden_size;
  RETURN_IF_ERROR(Gemm(normed_.get(), h, w_gate_up, mlp_gu_.get(), 2 * inter, num_tokens, 2 * inter,
                       h, OutType::kBf16, false));
  SiluAndMulParams sp;
  sp.gate_up = mlp_gu_.get(), sp.out = mlp_act_.get(), sp.m = num_tokens, sp.i = inter,
  sp.stream = stream_.get();
  sp.limit = static_cast<float>(config_.swiglu_limit);
  RETURN_IF_ERROR(RunSiluAndMul(sp));
  return Gemm(mlp_act_.get(), inter, w_down, resid_, h, num_tokens, h, inter, OutType::kFloat32,
              true);
}

absl::Status CudaModel::EnqueueMoe(int layer, int num_tokens, ExpertClient* experts) {
  const ModelConfig& c = config_;
  const DeviceLayerWeights& w = weights_->layer(layer);
  cudaStream_t s = stream_.get();
  const int h = c.hidden_size, e = c.n_routed_experts, k = c.num_experts_per_tok,
            inter = c.moe_intermediate_size;
  // The router in fp32, as DeepSeek computes it: routing decisions are discrete.
  RETURN_IF_ERROR(
      gemm_->RunF32(normed_f32_.get(), w.router, router_logits_.get(), num_tokens, e, h, false, s));
  MoeGateParams gp;
  gp.logits = router_logits_.get(), gp.bias = w.router_bias;
  gp.num_tokens = num_tokens, gp.num_experts = e, gp.top_k = k, gp.n_group = c.n_group,
  gp.topk_group = c.topk_group;
  gp.scoring = c.scoring_func == ScoringFunc::kSoftmax        ? GateScoring::kSoftmax
               : c.scoring_func == ScoringFunc::kSqrtSoftplus ? GateScoring::kSqrtSoftplus
                                                              : GateScoring::kSigmoid;
  if (w.v4.tid2eid != nullptr) gp.forced_table = w.v4.tid2eid, gp.token_ids = d_tokens_.get();
  gp.select = SelectOf(c.topk_method);
  gp.renormalize = c.norm_topk_prob;
  gp.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  gp.topk_ids = topk_ids_.get(), gp.topk_weights = topk_w_.get(), gp.stream = s;
  RETURN_IF_ERROR(RunMoeGate(gp));
  if (options_.record_routing) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(
        routing_log_.get() + static_cast<size_t>(layer) * max_tokens_ * k, topk_ids_.get(),
        static_cast<size_t>(num_tokens) * k * sizeof(int32_t), cudaMemcpyDeviceToDevice, s));
  }

  if (experts != nullptr) return RunExternalExperts(layer, num_tokens, experts);
  const int rows = num_tokens * k;
  // Tiles about as tall as an expert's share of the rows: each expert's
  // weights are then streamed about once (decode), or reused by 64 rows (prefill).
  const int tile_m = options_.moe_tile_m > 0 ? options_.moe_tile_m
                     : rows <= 12 * e        ? 16
                     : rows <= 40 * e        ? 32
                                             : 64;
  MoePermuteParams pp;
  pp.topk_ids = topk_ids_.get(), pp.num_tokens = num_tokens, pp.top_k = k, pp.num_experts = e,
  pp.tile_m = tile_m;
  pp.expert_offsets = expert_offsets_.get(), pp.tile_offsets = tile_offsets_.get();
  pp.row_token = row_token_.get(), pp.pair_row = pair_row_.get();
  pp.expert_counts = expert_counts_.get() + static_cast<size_t>(layer) * e, pp.stream = s;
  RETURN_IF_ERROR(RunMoePermute(pp));
  ExpertMlpParams mp;
  mp.x = normed_.get(), mp.ldx = h, mp.row_token = row_token_.get();
  mp.expert_offsets = expert_offsets_.get(), mp.tile_offsets = tile_offsets_.get(),
  mp.tile_m = tile_m;
  mp.rows = rows, mp.gate_up = w.experts_gate_up, mp.down = w.experts_down;
  mp.num_experts = e, mp.hidden = h, mp.inter = inter;
  mp.swiglu_limit = static_cast<float>(c.swiglu_limit);
  mp.gathered = moe_gathered_.get(), mp.gu = moe_gu_.get(), mp.act = moe_act_.get(),
  mp.y = moe_out_.get();
  mp.host_offsets = h_expert_offsets_.get(), mp.gemm = gemm_.get(), mp.stream = s;
  RETURN_IF_ERROR(EnqueueExpertMlp(mp));
  if (w.shared_gate_up != nullptr) {
    RETURN_IF_ERROR(
        EnqueueMlp(w.shared_gate_up, w.shared_down, weights_->shared_intermediate(), num_tokens));
  }
  MoeCombineParams cp;
  cp.expert_out = moe_out_.get(), cp.pair_row = pair_row_.get(), cp.topk_weights = topk_w_.get();
  cp.num_tokens = num_tokens, cp.top_k = k, cp.hidden = h, cp.x = resid_, cp.stream = s;
  return RunMoeCombine(cp);
}

absl::Status CudaModel::EnqueueHead(int num_tokens, int num_rows, bool sample, int top_k) {
  const ModelConfig& c = config_;
  if (c.is_v4()) {
    RETURN_IF_ERROR(EnqueueV4Head(num_tokens, num_rows));
  } else {
    RmsNormF32Params np;
    np.x = x_.get(), np.rows = d_head_rows_.get(), np.weight = weights_->norm(),
    np.num_rows = num_rows;
    np.n = c.hidden_size, np.eps = static_cast<float>(c.rms_norm_eps), np.y = head_normed_.get();
    np.stream = stream_.get();
    RETURN_IF_ERROR(RunRmsNormF32(np));
  }
  RETURN_IF_ERROR(Gemm(head_normed_.get(), c.hidden_size, weights_->lm_head(), logits_.get(),
                       c.vocab_size, num_rows, c.vocab_size, c.hidden_size, OutType::kFloat32,
                       false));
  if (!sample) return absl::OkStatus();
  GreedyLogprobsParams gp;
  gp.logits = logits_.get(), gp.batch = num_rows, gp.vocab = c.vocab_size, gp.ld = c.vocab_size,
  gp.top_k = top_k;
  gp.next_ids = next_ids_.get(), gp.next_logprobs = next_lp_.get();
  gp.topk_ids = topk_out_ids_.get(), gp.topk_logprobs = topk_lp_.get(), gp.stream = stream_.get();
  return RunGreedyLogprobs(gp);
}

absl::Status CudaModel::EnqueueSample(const StepSampling& sampling, const std::vector<int>& order,
                                      size_t first, int rows) {
  cudaStream_t s = stream_.get();
  std::vector<SampleRow> chunk(rows);
  for (int r = 0; r < rows; ++r) chunk[r] = sampling.rows[order[first + r]];
  // Pageable sources: each copy has read its source when it returns.
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(d_sample_rows_.get(), chunk.data(), rows * sizeof(SampleRow),
                                       cudaMemcpyHostToDevice, s));
  if (first == 0 && !sampling.penalties.empty()) {
    if (d_penalties_.size() < sampling.penalties.size()) {
      RETURN_IF_ERROR(stream_.Synchronize());  // the old buffer may still be read
      RETURN_IF_ERROR(
          d_penalties_.Reallocate(std::max(sampling.penalties.size(), 2 * d_penalties_.size())));
    }
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(d_penalties_.get(), sampling.penalties.data(),
                                         sampling.penalties.size() * sizeof(PenaltyEntry),
                                         cudaMemcpyHostToDevice, s));
  }
  SampleParams p;
  p.logits = logits_.get(), p.batch = rows, p.vocab = config_.vocab_size, p.ld = config_.vocab_size;
  p.rows = d_sample_rows_.get(), p.penalties = d_penalties_.get(), p.ids = next_ids_.get(),
  p.stream = s;
  return RunSample(p);
}

absl::Status CudaModel::Commit(absl::Span<const SequenceTokens> seqs) {
  for (const SequenceTokens& st : seqs) {
    store_->at(st.seq).length += static_cast<int>(st.tokens.size());
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> CudaModel::Step(absl::Span<const SequenceTokens> seqs, int top_logprobs,
                                           ExpertClient* experts, const StepSampling* sampling) {
  RETURN_IF_ERROR(CheckExperts(experts));
  if (sampling != nullptr && sampling->rows.size() != seqs.size()) {
    return absl::InvalidArgumentError(absl::StrCat("CudaModel::Step: ", sampling->rows.size(),
                                                   " sampling rows for ", seqs.size(),
                                                   " sequences"));
  }
  if (top_logprobs < 0 || top_logprobs > sampling::kMaxTopK) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaModel::Step: top_logprobs must be in [0, ", sampling::kMaxTopK, "]"));
  }
  std::vector<Batch> chunks;
  std::vector<int> order;
  RETURN_IF_ERROR(Plan(seqs, &chunks, &order));
  const int n = static_cast<int>(seqs.size()), k = top_logprobs;
  StepOutput out;
  out.top_k = k;
  out.next_ids.assign(n, -1);
  out.next_logprobs.assign(n, 0.0f);
  out.topk_ids.assign(static_cast<size_t>(n) * k, -1);
  out.topk_logprobs.assign(static_cast<size_t>(n) * k, 0.0f);
  graphs_->ResetLastReplayed();
  cudaStream_t s = stream_.get();
  size_t done = 0;
  for (const Batch& b : chunks) {
    const int rows = b.decode ? n : b.num_rows;
    int32_t* hi = h_ids_.get();
    float* hl = h_lp_.get();
    RETURN_IF_ERROR(RunChecked(experts, [&]() -> absl::Status {
      RETURN_IF_ERROR(Upload(b));
      if (b.decode && options_.cuda_graphs && experts == nullptr) {
        RETURN_IF_ERROR(RunDecodeGraph(b, k));
      } else if (b.decode && options_.cuda_graphs && experts->dispatch_device() == info_.device) {
        RETURN_IF_ERROR(RunPiecewiseGraph(b, k, experts));
      } else {
        RETURN_IF_ERROR(EnqueueForward(b, true, k, experts));
      }
      if (rows > 0 && sampling != nullptr)
        RETURN_IF_ERROR(EnqueueSample(*sampling, order, done, rows));
      if (rows > 0) {
        RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(hi, next_ids_.get(), rows * sizeof(int32_t),
                                             cudaMemcpyDeviceToHost, s));
        RETURN_IF_CUDA_ERROR(
            cudaMemcpyAsync(hl, next_lp_.get(), rows * sizeof(float), cudaMemcpyDeviceToHost, s));
        if (k > 0) {
          RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(hi + rows, topk_out_ids_.get(),
                                               rows * k * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                               s));
          RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(hl + rows, topk_lp_.get(), rows * k * sizeof(float),
                                               cudaMemcpyDeviceToHost, s));
        }
      }
      return stream_.Synchronize();
    }));
    if (rows > 0) {
      for (int r = 0; r < rows; ++r) {
        const int i = order[done + r];
        if (hi[r] < 0 || hi[r] >= config_.vocab_size) {
          return absl::InternalError(absl::StrCat("CudaModel::Step: no token chosen for sequence ",
                                                  i, " (non-finite logits?)"));
        }
        out.next_ids[i] = hi[r];
        out.next_logprobs[i] = hl[r];
        for (int j = 0; j < k; ++j) {
          out.topk_ids[static_cast<size_t>(i) * k + j] = hi[rows + r * k + j];
          out.topk_logprobs[static_cast<size_t>(i) * k + j] = hl[rows + r * k + j];
        }
      }
      done += rows;
    }
  }
  RETURN_IF_ERROR(Commit(seqs));
  return out;
}

absl::StatusOr<std::vector<float>> CudaModel::ForwardLogits(absl::Span<const SequenceTokens> seqs,
                                                            ExpertClient* experts) {
  RETURN_IF_ERROR(CheckExperts(experts));
  std::vector<Batch> chunks;
  std::vector<int> order;
  RETURN_IF_ERROR(Plan(seqs, &chunks, &order));
  const int n = static_cast<int>(seqs.size());
  const size_t vocab = config_.vocab_size;
  std::vector<float> out(n * vocab);
  std::vector<float> rows_host;
  graphs_->ResetLastReplayed();
  size_t done = 0;
  for (const Batch& b : chunks) {
    const int rows = b.decode ? n : b.num_rows;
    rows_host.resize(rows * vocab);
    RETURN_IF_ERROR(RunChecked(experts, [&]() -> absl::Status {
      RETURN_IF_ERROR(Upload(b));
      RETURN_IF_ERROR(EnqueueForward(b, false, 0, experts));
      if (rows > 0) {
        RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(rows_host.data(), logits_.get(),
                                             rows * vocab * sizeof(float), cudaMemcpyDeviceToHost,
                                             stream_.get()));
      }
      return stream_.Synchronize();
    }));
    for (int r = 0; r < rows; ++r) {
      std::memcpy(&out[order[done + r] * vocab], &rows_host[r * vocab], vocab * sizeof(float));
    }
    done += rows;
  }
  RETURN_IF_ERROR(Commit(seqs));
  return out;
}

absl::Status CudaModel::CheckExperts(const ExpertClient* experts) const {
  if (experts == nullptr && !options_.routed_experts_on_device) {
    return absl::FailedPreconditionError(
        "CudaModel: the routed experts are not on this device; pass an ExpertClient");
  }
  if (experts != nullptr && options_.routed_experts_on_device) {
    return absl::FailedPreconditionError(
        "CudaModel: the routed experts are on this device; an ExpertClient is not used");
  }
  return absl::OkStatus();
}

absl::Status CudaModel::SetMoeTileM(int tile_m) {
  if (tile_m != 0 && tile_m != 16 && tile_m != 32 && tile_m != 64) {
    return absl::InvalidArgumentError("CudaModel::SetMoeTileM: 0, 16, 32 or 64");
  }
  RETURN_IF_ERROR(stream_.Synchronize());
  graphs_->Clear();
  options_.moe_tile_m = tile_m;
  return absl::OkStatus();
}

}  // namespace moesh::cuda
