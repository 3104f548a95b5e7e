#include "common/cuda_backend/cuda_attention_backend.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/cuda_backend/sample_rows.h"
#include "kernels/cuda/config.h"

namespace moesh::cuda {

// A CudaModel sequence as a KvSequence. Rows cross to the host only through
// AppendRows / Rows (the KV handoff); a CUDA error there is kept and fails
// the sequence's next forward pass (the KvSequence calls return no status).
class CudaAttentionBackend::Sequence : public KvSequence {
 public:
  // `cached`: the leading rows the sequence starts with (the prefix cache's).
  Sequence(CudaAttentionBackend* backend, int id, int capacity, int cached)
      : backend_(backend),
        id_(id),
        capacity_(capacity),
        length_(cached),
        cached_tokens_(cached),
        rows_(backend->config().num_hidden_layers, cached) {}
  ~Sequence() override {
    absl::MutexLock lock(&backend_->mu_);
    cudaSetDevice(backend_->model_->device_info().device);
    absl::Status s = backend_->model_->ReleaseSequence(id_);
    if (!s.ok()) std::cerr << "CudaAttentionBackend: " << s << std::endl;
  }

  int row_width() const override { return backend_->model_->kv_row_width(); }
  int length() const override { return length_; }
  int num_rows(int layer) const override { return rows_[layer]; }
  int capacity() const override { return capacity_; }
  int cached_tokens() const override { return cached_tokens_; }
  void PublishPrefix(absl::Span<const int32_t> tokens) override {
    absl::MutexLock lock(&backend_->mu_);
    absl::Status s = backend_->model_->PublishSequence(id_, tokens);
    if (!s.ok() && status_.ok()) status_ = s;
  }
  absl::Status Reserve(int tokens) override {
    if (tokens <= capacity_) return absl::OkStatus();
    absl::MutexLock lock(&backend_->mu_);
    RETURN_IF_CUDA_ERROR(cudaSetDevice(backend_->model_->device_info().device));
    RETURN_IF_ERROR(backend_->model_->ReserveSequence(id_, tokens));
    capacity_ = std::min(backend_->model_->max_model_len(),
                         (tokens + kKvBlockSize - 1) / kKvBlockSize * kKvBlockSize);
    return absl::OkStatus();
  }
  // The device cache's values are bf16 (or FP8 codes times power-of-two
  // scales, which bf16 holds exactly): rows sent as bf16 lose nothing.
  bool bf16_rows() const override { return true; }

  void AppendRows(int layer, const float* src, int n) override {
    absl::MutexLock lock(&backend_->mu_);
    cudaSetDevice(backend_->model_->device_info().device);
    absl::Status s = backend_->model_->AppendKvRows(id_, layer, src, n);
    if (!s.ok()) {
      if (status_.ok()) status_ = s;
      return;
    }
    rows_[layer] += n;
    if (layer == static_cast<int>(rows_.size()) - 1) length_ += n;
  }

  const float* Rows(int layer, std::vector<float>* scratch) const override {
    absl::MutexLock lock(&backend_->mu_);
    cudaSetDevice(backend_->model_->device_info().device);
    absl::StatusOr<std::vector<float>> rows =
        backend_->model_->ReadKvRows(id_, layer, rows_[layer]);
    if (rows.ok()) {
      *scratch = std::move(*rows);
    } else {  // never valid-looking rows: NaN, and the error kept
      if (status_.ok()) status_ = rows.status();
      scratch->assign(static_cast<size_t>(rows_[layer]) * row_width(),
                      std::numeric_limits<float>::quiet_NaN());
    }
    return scratch->data();
  }

  absl::StatusOr<DeviceKvBlocks> DeviceBlocks() const override {
    absl::MutexLock lock(&backend_->mu_);
    RETURN_IF_CUDA_ERROR(cudaSetDevice(backend_->model_->device_info().device));
    return backend_->model_->ExportKv(id_);
  }

  absl::Status AppendDeviceBlocks(const DeviceKvBlocks& src, int length) override {
    if (length_ != cached_tokens_) {
      return absl::FailedPreconditionError(
          "AppendDeviceBlocks: the sequence holds more than its cached tokens");
    }
    if (length > capacity_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("AppendDeviceBlocks: ", length, " tokens; the sequence holds ", capacity_));
    }
    {
      absl::MutexLock lock(&backend_->mu_);
      RETURN_IF_CUDA_ERROR(cudaSetDevice(backend_->model_->device_info().device));
      RETURN_IF_ERROR(backend_->model_->ImportKv(id_, src, length));
    }
    length_ = length;
    for (int& r : rows_) r = length;
    return absl::OkStatus();
  }

  int id() const { return id_; }
  const CudaAttentionBackend* owner() const { return backend_; }
  absl::Status status() const override { return status_; }
  // After a forward pass appended n tokens to every layer.
  void Advance(int n) {
    length_ += n;
    for (int& r : rows_) r += n;
  }

 private:
  CudaAttentionBackend* const backend_;
  const int id_;
  int capacity_;  // grows (Reserve)
  int length_;
  const int cached_tokens_;
  std::vector<int> rows_;
  mutable absl::Status status_;
};

CudaAttentionBackend::CudaAttentionBackend(std::unique_ptr<CudaModel> model)
    : model_(std::move(model)),
      device_(absl::StrCat("cuda:", model_->device_info().device)),
      has_experts_(model_->has_routed_experts()) {}

CudaAttentionBackend::~CudaAttentionBackend() = default;

absl::StatusOr<std::unique_ptr<KvSequence>> CudaAttentionBackend::NewSequence(int max_tokens) {
  return NewCachedSequence(max_tokens, {});
}

absl::StatusOr<std::unique_ptr<KvSequence>> CudaAttentionBackend::NewCachedSequence(
    int max_tokens, absl::Span<const int32_t> tokens) {
  absl::MutexLock lock(&mu_);
  if (max_tokens < 0 || max_tokens > model_->max_model_len()) {
    return absl::InvalidArgumentError(absl::StrCat("a sequence of ", max_tokens,
                                                   " tokens exceeds max_model_len ",
                                                   model_->max_model_len(), " of ", device_));
  }
  RETURN_IF_CUDA_ERROR(cudaSetDevice(model_->device_info().device));
  ASSIGN_OR_RETURN(const int id, model_->AddSequence(max_tokens, tokens));
  ASSIGN_OR_RETURN(const int cached, model_->SequenceLength(id));
  const int held = std::max(max_tokens, cached + (cached > 0 ? 1 : 0));
  const int capacity =
      std::min(model_->max_model_len(), (held + kKvBlockSize - 1) / kKvBlockSize * kKvBlockSize);
  return std::unique_ptr<KvSequence>(new Sequence(this, id, capacity, cached));
}

PrefixCacheStats CudaAttentionBackend::prefix_cache_stats() const {
  absl::MutexLock lock(&mu_);
  return model_->kv_blocks().stats();
}

std::vector<uint64_t> CudaAttentionBackend::CachedBlockHashes(int max) const {
  absl::MutexLock lock(&mu_);
  return model_->kv_blocks().CachedHashes(max);
}

absl::Status CudaAttentionBackend::Prepare(absl::Span<const SequenceInput> seqs,
                                           ExpertClient* experts, std::vector<Sequence*>* owned,
                                           std::vector<SequenceTokens>* tokens) {
  if ((experts == nullptr) != has_experts_) {  // experts given iff the backend does not hold them
    return absl::InvalidArgumentError(
        has_experts_ ? "this CUDA backend holds the experts; pass no ExpertClient"
                     : "this CUDA backend needs an ExpertClient for the routed experts");
  }
  owned->assign(seqs.size(), nullptr);
  tokens->assign(seqs.size(), SequenceTokens{});
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto* s = dynamic_cast<Sequence*>(seqs[i].cache);
    if (s == nullptr || s->owner() != this)
      return absl::InvalidArgumentError("a sequence not made by this CUDA backend");
    if (!s->status().ok()) {
      return absl::InternalError(
          absl::StrCat("the sequence's KV transfer failed earlier: ", s->status().message()));
    }
    if (seqs[i].tokens.empty()) return absl::InvalidArgumentError("a sequence with no new tokens");
    if (s->length() + static_cast<int>(seqs[i].tokens.size()) > s->capacity()) {
      return absl::ResourceExhaustedError(absl::StrCat("a sequence of capacity ", s->capacity(),
                                                       " cannot take ", seqs[i].tokens.size(),
                                                       " more tokens after ", s->length()));
    }
    (*owned)[i] = s;
    (*tokens)[i] = {s->id(), seqs[i].tokens};
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> CudaAttentionBackend::Forward(
    absl::Span<const SequenceInput> seqs, ExpertClient* experts, int /*micro_batches*/) {
  return Logits(seqs, experts, false);
}

absl::StatusOr<std::vector<float>> CudaAttentionBackend::ForwardAllPositions(
    absl::Span<const SequenceInput> seqs, ExpertClient* experts) {
  return Logits(seqs, experts, true);
}

absl::StatusOr<std::vector<float>> CudaAttentionBackend::Logits(
    absl::Span<const SequenceInput> seqs, ExpertClient* experts, bool all_positions) {
  std::vector<Sequence*> owned;
  std::vector<SequenceTokens> tokens;
  RETURN_IF_ERROR(Prepare(seqs, experts, &owned, &tokens));
  absl::StatusOr<std::vector<float>> logits;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_CUDA_ERROR(cudaSetDevice(model_->device_info().device));
    logits = all_positions ? model_->ForwardAllLogits(tokens, experts)
                           : model_->ForwardLogits(tokens, experts);
  }
  if (logits.ok()) {
    for (size_t i = 0; i < seqs.size(); ++i)
      owned[i]->Advance(static_cast<int>(seqs[i].tokens.size()));
  }
  return logits;
}

absl::StatusOr<SampledTokens> CudaAttentionBackend::ForwardSample(
    absl::Span<const SequenceInput> seqs, ExpertClient* experts,
    absl::Span<const SampleRequest> samples, int top_logprobs, int micro_batches) {
  // Plain greedy batches keep the step's argmax; others run the sampler.
  const bool greedy = std::all_of(samples.begin(), samples.end(),
                                  [](const SampleRequest& r) { return r.params->plain_greedy(); });
  const bool host = std::any_of(samples.begin(), samples.end(), [&](const SampleRequest& r) {
    return r.prompt_logprobs >= 0 || (!greedy && r.params->wants_logprob());
  });
  if (top_logprobs > sampling::kMaxTopK || host) {
    return AttentionBackend::ForwardSample(seqs, experts, samples, top_logprobs, micro_batches);
  }
  RETURN_IF_ERROR(CheckSampleRequests(seqs, samples, top_logprobs));
  StepSampling sampling;
  for (size_t i = 0; i < samples.size() && !greedy; ++i) {
    const SampleRequest& r = samples[i];
    AppendSampleRow(*r.params, r.draw, r.prompt, r.output, &sampling.rows, &sampling.penalties);
  }
  std::vector<Sequence*> owned;
  std::vector<SequenceTokens> tokens;
  RETURN_IF_ERROR(Prepare(seqs, experts, &owned, &tokens));
  absl::StatusOr<StepOutput> step;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_CUDA_ERROR(cudaSetDevice(model_->device_info().device));
    step = model_->Step(tokens, top_logprobs, experts, greedy ? nullptr : &sampling);
  }
  if (!step.ok()) return step.status();
  for (size_t i = 0; i < seqs.size(); ++i)
    owned[i]->Advance(static_cast<int>(seqs[i].tokens.size()));
  SampledTokens out;
  out.ids = std::move(step->next_ids);
  out.prompt_logprobs.resize(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    // Greedy here: the chosen token is the argmax whose logprob the step returns.
    out.logprobs.push_back(samples[i].params->wants_logprob() ? step->next_logprobs[i] : 0.0f);
  }
  for (size_t i = 0; i < seqs.size() && top_logprobs > 0; ++i) {
    std::vector<TokenLogprob> row(top_logprobs);
    for (int j = 0; j < top_logprobs; ++j) {
      row[j].id = step->topk_ids[i * top_logprobs + j];
      row[j].logprob = step->topk_logprobs[i * top_logprobs + j];
    }
    out.top_logprobs.push_back(std::move(row));
  }
  return out;
}

KvUsage CudaAttentionBackend::kv_usage() const {
  absl::MutexLock lock(&mu_);
  KvUsage u;
  u.total_blocks = model_->kv_pool().num_blocks();
  u.free_blocks = model_->kv_blocks().free_blocks();
  u.block_size = kKvBlockSize;
  return u;
}

}  // namespace moesh::cuda
