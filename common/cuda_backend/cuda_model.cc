#include "common/cuda_backend/cuda_model.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <iostream>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model/safetensors.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/routing.h"

namespace moesh::cuda {
namespace {

// Memory left out of the KV cache's share for cuBLAS, graphs and the runtime.
constexpr size_t kReserveBytes = size_t{768} << 20;

// What the options and the config ask that this model cannot do, before
// any weight reaches the device.
absl::Status CheckOptions(const ModelConfig& c, const CudaModelOptions& o) {
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
  if (o.fp8_kv_cache && c.layers() == LayerArch::kV4) {
    return absl::UnimplementedError(
        "CudaModel: the FP8 KV cache holds MLA's latent and rope rows (DeepSeek-V2, V3 and "
        "V3.2); DeepSeek-V4's compressed entries are not FP8 here");
  }
  if (o.fp8_kv_cache && (c.kv_lora_rank % 16 != 0 || c.kv_lora_rank > 1024)) {
    return absl::UnimplementedError(
        absl::StrCat("CudaModel: the FP8 KV cache needs kv_lora_rank "
                     "a multiple of 16 up to 1024, not ",
                     c.kv_lora_rank));
  }
  return absl::OkStatus();
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
  return FromCheckpoint(config, *ckpt, options);
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::FromCheckpoint(
    const ModelConfig& config, const Checkpoint& ckpt, const CudaModelOptions& options) {
  RETURN_IF_ERROR(CheckOptions(config, options));
  ASSIGN_OR_RETURN(Stream stream, Stream::Create());
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceWeights> w,
                   DeviceWeights::FromCheckpoint(config, ckpt, options.routed_experts_on_device,
                                                 options.fp8_linears || config.fp8_block_weights));
  return Create(config, options, std::move(w), std::move(stream));
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::FromHost(const ModelConfig& config,
                                                               const AttentionWeights& attention,
                                                               const ExpertShardWeights* experts,
                                                               const CudaModelOptions& options) {
  if (options.routed_experts_on_device && experts == nullptr) {
    return absl::InvalidArgumentError(
        "CudaModel::FromHost: routed_experts_on_device needs the experts");
  }
  RETURN_IF_ERROR(CheckOptions(config, options));
  ASSIGN_OR_RETURN(Stream stream, Stream::Create());
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceWeights> w,
                   DeviceWeights::FromHost(config, attention,
                                           options.routed_experts_on_device ? experts : nullptr,
                                           options.fp8_linears || config.fp8_block_weights));
  return Create(config, options, std::move(w), std::move(stream));
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Dummy(const ModelConfig& config,
                                                            uint64_t seed,
                                                            const CudaModelOptions& options) {
  RETURN_IF_ERROR(CheckOptions(config, options));
  ASSIGN_OR_RETURN(Stream stream, Stream::Create());
  ASSIGN_OR_RETURN(
      std::unique_ptr<DeviceWeights> w,
      DeviceWeights::Dummy(config, seed, stream.get(), options.routed_experts_on_device,
                           options.fp8_linears || config.fp8_block_weights));
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
  ASSIGN_OR_RETURN(info_, CurrentDeviceInfo());
  ASSIGN_OR_RETURN(gemm_, CublasGemm::Create());
  const int pos_limit = c.max_position_embeddings > 0 ? c.max_position_embeddings : 1 << 30;
  max_model_len_ = o.max_model_len > 0 ? o.max_model_len : std::min(pos_limit, 8192);
  if (max_model_len_ > pos_limit) {
    return absl::InvalidArgumentError(absl::StrCat("CudaModel: max_model_len ", max_model_len_,
                                                   " exceeds max_position_embeddings ", pos_limit));
  }
  StepLimits limits;
  limits.max_tokens = std::max(o.max_tokens_per_step, o.max_num_seqs);
  limits.max_rows = o.max_num_seqs;
  limits.max_tokens_per_step = o.max_tokens_per_step;
  limits.max_model_len = max_model_len_;
  limits.vocab_size = c.vocab_size;
  ASSIGN_OR_RETURN(planner_, StepPlanner::Create(limits));

  ctx_ = std::make_unique<ForwardContext>(config_, options_);
  ctx_->info = info_;
  ctx_->stream = stream_.get();
  ctx_->gemm = gemm_.get();
  ctx_->weights = weights_.get();
  ctx_->in = &planner_->inputs();
  ctx_->graphs = graphs_.get();
  ctx_->max_tokens = limits.max_tokens;
  ctx_->max_rows = limits.max_rows;
  ctx_->max_model_len = max_model_len_;
  ctx_->buckets = planner_->buckets();
  RETURN_IF_ERROR(ctx_->AllocateFp8Scratch());
  ASSIGN_OR_RETURN(ffn_, FfnBlock::Create(*ctx_));
  ASSIGN_OR_RETURN(stack_, MakeLayerStack(*ctx_, ffn_.get()));

  const size_t rows = o.max_num_seqs;
  const size_t logit_row_bytes = static_cast<size_t>(c.vocab_size) * sizeof(float);
  all_position_rows_ = static_cast<int>(std::min<size_t>(
      limits.max_tokens, std::max<size_t>(rows, kAllPositionLogitBytes / logit_row_bytes)));
  const size_t head_rows = std::max<size_t>(rows, all_position_rows_);
  RETURN_IF_ERROR(head_normed_.Reallocate(head_rows * c.hidden_size));
  RETURN_IF_ERROR(logits_.Reallocate(head_rows * c.vocab_size));
  {
    std::vector<int32_t> iota(limits.max_tokens);
    for (size_t i = 0; i < iota.size(); ++i) iota[i] = static_cast<int32_t>(i);
    RETURN_IF_ERROR(iota_rows_.Reallocate(iota.size()));
    RETURN_IF_CUDA_ERROR(cudaMemcpy(iota_rows_.get(), iota.data(), iota.size() * sizeof(int32_t),
                                    cudaMemcpyHostToDevice));
  }
  RETURN_IF_ERROR(next_ids_.Reallocate(rows));
  RETURN_IF_ERROR(d_sample_rows_.Reallocate(rows));
  RETURN_IF_ERROR(next_lp_.Reallocate(rows));
  RETURN_IF_ERROR(topk_out_ids_.Reallocate(rows * sampling::kMaxTopK));
  RETURN_IF_ERROR(topk_lp_.Reallocate(rows * sampling::kMaxTopK));
  ASSIGN_OR_RETURN(h_ids_, PinnedBuffer<int32_t>::Create(rows * (1 + sampling::kMaxTopK)));
  ASSIGN_OR_RETURN(h_lp_, PinnedBuffer<float>::Create(rows * (1 + sampling::kMaxTopK)));
  RETURN_IF_ERROR(InitKvStore());
  // The weights and tables came in through synchronous copies on the legacy
  // stream, which a non-blocking stream does not wait for.
  return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

KvRowSpec CudaModel::kv_row_spec() const {
  if (!options_.fp8_kv_cache) return KvRowSpec::Bf16(kv_row_width());
  // V3.2's index key rides after the rope part, in bf16 like it: the FP8
  // layout's bf16 part is then rope + index key (MlaLayerStack::IndexKeyOffset).
  return KvRowSpec::Fp8(config_.kv_lora_rank, kv_row_width() - config_.kv_lora_rank);
}

absl::Status CudaModel::InitKvStore() {
  const ModelConfig& c = config_;
  const CudaModelOptions& o = options_;
  const int max_blocks_per_seq = planner_->max_blocks_per_seq();
  size_t free_bytes = 0, total_bytes = 0;
  RETURN_IF_CUDA_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  const double budget = o.gpu_memory_utilization * static_cast<double>(total_bytes) -
                        static_cast<double>(total_bytes - free_bytes) -
                        static_cast<double>(kReserveBytes);
  const size_t block_bytes =
      KvPool::BlockBytes(c.num_hidden_layers, kv_row_spec()) + stack_->ExtraBlockBytes();
  int64_t blocks = budget > 0 ? static_cast<int64_t>(budget / static_cast<double>(block_bytes)) : 0;
  blocks = std::min<int64_t>(blocks, static_cast<int64_t>(o.max_num_seqs) * max_blocks_per_seq);
  if (o.max_kv_blocks > 0) blocks = std::min<int64_t>(blocks, o.max_kv_blocks);
  if (blocks < max_blocks_per_seq) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CudaModel: the KV cache gets ", blocks, " blocks of ", block_bytes,
                     " bytes; one sequence of ", max_model_len_, " tokens needs ",
                     max_blocks_per_seq, " (weights take ", weights_->bytes(),
                     " bytes; raise gpu_memory_utilization or lower max_model_len)"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<KvPool> pool,
                   KvPool::Create(c.num_hidden_layers, kv_row_spec(), static_cast<int>(blocks)));
  store_ = std::make_unique<KvStore>(std::move(pool), max_model_len_,
                                     o.prefix_cache && c.family != ModelFamily::kDeepseekV4);
  kv_ = &store_->pool();
  ctx_->store = store_.get();
  return stack_->AttachPool(static_cast<int>(blocks));
}

absl::Status CudaModel::EnqueueForward(const StepBatch& b, bool sample, int top_k,
                                       ExpertClient* experts) {
  RETURN_IF_ERROR(stack_->Enqueue(b, experts));
  if (b.num_rows > 0) RETURN_IF_ERROR(EnqueueHead(b.num_tokens, b.num_rows, sample, top_k));
  return ctx_->Mark(2 + 2 * config_.num_hidden_layers);
}

absl::Status CudaModel::EnqueueLogits(int num_tokens, int num_rows, const int32_t* rows) {
  const ModelConfig& c = config_;
  RETURN_IF_ERROR(stack_->EnqueueFinalNorm(num_tokens, num_rows, rows, head_normed_.get()));
  return ctx_->Gemm(head_normed_.get(), c.hidden_size, weights_->lm_head(), logits_.get(),
                    c.vocab_size, num_rows, c.vocab_size, c.hidden_size, OutType::kFloat32, false);
}

absl::Status CudaModel::EnqueueHead(int num_tokens, int num_rows, bool sample, int top_k) {
  const ModelConfig& c = config_;
  RETURN_IF_ERROR(EnqueueLogits(num_tokens, num_rows, ctx_->in->head_rows));
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
  std::vector<StepBatch> chunks;
  std::vector<int> order;
  RETURN_IF_ERROR(planner_->Plan(seqs, store_.get(), &chunks, &order));
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
  for (const StepBatch& b : chunks) {
    const int rows = b.decode ? n : b.num_rows;
    int32_t* hi = h_ids_.get();
    float* hl = h_lp_.get();
    RETURN_IF_ERROR(RunChecked(experts, [&]() -> absl::Status {
      RETURN_IF_ERROR(planner_->Upload(b, stream_.get(), stack_->needs_segments()));
      if (b.decode && options_.cuda_graphs && experts == nullptr) {
        RETURN_IF_ERROR(RunDecodeGraph(b, k));
      } else if (b.decode && options_.cuda_graphs &&
                 experts->memory_kinds().Takes(DispatchMemory::CudaDevice(info_.device))) {
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
  std::vector<StepBatch> chunks;
  std::vector<int> order;
  RETURN_IF_ERROR(planner_->Plan(seqs, store_.get(), &chunks, &order));
  const int n = static_cast<int>(seqs.size());
  const size_t vocab = config_.vocab_size;
  std::vector<float> out(n * vocab);
  std::vector<float> rows_host;
  graphs_->ResetLastReplayed();
  size_t done = 0;
  for (const StepBatch& b : chunks) {
    const int rows = b.decode ? n : b.num_rows;
    rows_host.resize(rows * vocab);
    RETURN_IF_ERROR(RunChecked(experts, [&]() -> absl::Status {
      RETURN_IF_ERROR(planner_->Upload(b, stream_.get(), stack_->needs_segments()));
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

absl::StatusOr<std::vector<float>> CudaModel::ForwardAllLogits(
    absl::Span<const SequenceTokens> seqs, ExpertClient* experts) {
  RETURN_IF_ERROR(CheckExperts(experts));
  std::vector<StepBatch> chunks;
  std::vector<int> order;
  RETURN_IF_ERROR(planner_->Plan(seqs, store_.get(), &chunks, &order));
  size_t total = 0;
  for (const SequenceTokens& st : seqs) total += st.tokens.size();
  const size_t vocab = config_.vocab_size;
  std::vector<float> out(total * vocab);
  graphs_->ResetLastReplayed();
  size_t done = 0;  // rows of `out` written: the passes hold the tokens in `seqs`' order
  for (const StepBatch& b : chunks) {
    const int rows = b.real_tokens >= 0 ? b.real_tokens : b.num_tokens;  // a decode pass's padding
    RETURN_IF_ERROR(RunChecked(experts, [&]() -> absl::Status {
      RETURN_IF_ERROR(planner_->Upload(b, stream_.get(), stack_->needs_segments()));
      RETURN_IF_ERROR(stack_->Enqueue(b, experts));
      for (int r = 0; r < rows; r += all_position_rows_) {
        const int n = std::min(all_position_rows_, rows - r);
        RETURN_IF_ERROR(EnqueueLogits(b.num_tokens, n, iota_rows_.get() + r));
        // In stream order: the next chunk's head writes logits_ after this copy.
        RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(out.data() + (done + r) * vocab, logits_.get(),
                                             n * vocab * sizeof(float), cudaMemcpyDeviceToHost,
                                             stream_.get()));
      }
      return stream_.Synchronize();
    }));
    done += rows;
  }
  if (done != total) {
    return absl::InternalError(
        absl::StrCat("CudaModel::ForwardAllLogits: ", done, " rows for ", total, " tokens"));
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

absl::Status CudaModel::RunChecked(ExpertClient* experts,
                                   const std::function<absl::Status()>& run) {
  for (int attempt = 0;; ++attempt) {
    RETURN_IF_ERROR(run());
    if (experts == nullptr) return absl::OkStatus();
    const absl::Status checked = experts->CheckDeviceDispatches();
    if (checked.ok() || checked.code() != absl::StatusCode::kUnavailable || attempt > 0)
      return checked;
    // The chunk rewrites the same cache rows and draws the same samples.
    std::cerr << "CudaModel: an expert worker failed under this step (" << checked.message()
              << "); running the step again on the other replicas" << std::endl;
  }
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
