// CudaAttentionBackend: common/engine's AttentionBackend on one GPU — a
// CudaModel (bf16 weights, the paged latent cache in device memory) whose
// sequences are KvSequences, so the prefill and decode engines, the KV
// handoff and `moesh generate` run on it unchanged.
//
// Sequences: NewSequence reserves the blocks of max_tokens on the device;
// KvSequence::Reserve adds blocks as a decoding sequence grows. With the
// prefix cache (DeviceOptions::prefix_cache; not V4) NewCachedSequence
// starts a prompt's sequence with the full blocks other sequences published
// for the same leading tokens (KvSequence::PublishPrefix).
// Their rows cross to the host only for the KV handoff (AppendRows on the
// decode side, Rows on the prefill side: float32 on the host, bf16 on the
// device). ForwardSample samples on the device (CudaModel::Step with the
// requests as GPU sampler rows); Forward returns each sequence's fp32 logits
// on the host, ForwardAllPositions every new token's (CudaModel::
// ForwardAllLogits: lm_head in chunks of at most 256 MB of fp32 logits on
// the device, eager; prompt log-probabilities).
//
// Thread-safe: one lock around the model; a sequence has one owner at a time
// and may be destroyed from any thread.
#ifndef MOESH_COMMON_CUDA_BACKEND_CUDA_ATTENTION_BACKEND_H_
#define MOESH_COMMON_CUDA_BACKEND_CUDA_ATTENTION_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/cuda_backend/cuda_model.h"
#include "common/engine/attention_backend.h"

namespace moesh::cuda {

class CudaAttentionBackend : public AttentionBackend {
 public:
  // Takes the model; its options say whether it holds the routed experts.
  explicit CudaAttentionBackend(std::unique_ptr<CudaModel> model);
  ~CudaAttentionBackend() override;

  const ModelConfig& config() const override { return model_->config(); }
  std::string device() const override { return device_; }
  absl::StatusOr<std::unique_ptr<KvSequence>> NewSequence(int max_tokens) override;
  // With the model's prefix cache (CudaModel::prefix_cache()): the sequence
  // starts with the cached rows of the leading full blocks of `tokens`.
  absl::StatusOr<std::unique_ptr<KvSequence>> NewCachedSequence(
      int max_tokens, absl::Span<const int32_t> tokens) override;
  PrefixCacheStats prefix_cache_stats() const override;
  std::vector<uint64_t> CachedBlockHashes(int max) const override;
  absl::StatusOr<std::vector<float>> Forward(absl::Span<const SequenceInput> seqs,
                                             ExpertClient* experts, int micro_batches = 1) override;
  // AttentionBackend's contract: [total new tokens, vocab] fp32 on the host.
  absl::StatusOr<std::vector<float>> ForwardAllPositions(absl::Span<const SequenceInput> seqs,
                                                         ExpertClient* experts) override;
  bool has_all_position_logits() const override { return true; }
  // On the device (CudaModel::Step): only ids and log-probabilities leave it;
  // a greedy token's own log-probability is the step's next_logprobs.
  // Through Forward and the host (the base class) instead: more than
  // sampling::kMaxTopK top_logprobs, and a sampled (not plain greedy) batch
  // with a request for the sampled token's own log-probability (the GPU
  // sampler overwrites the raw logits it would be read from), and prompt
  // log-probabilities (ForwardAllPositions' logits, as the CPU backend).
  absl::StatusOr<SampledTokens> ForwardSample(absl::Span<const SequenceInput> seqs,
                                              ExpertClient* experts,
                                              absl::Span<const SampleRequest> samples,
                                              int top_logprobs, int micro_batches = 1) override;
  KvUsage kv_usage() const override;
  bool has_experts() const override { return has_experts_; }

 private:
  class Sequence;
  friend class Sequence;
  // Checks the sequences and experts for a pass, as Forward documents.
  absl::Status Prepare(absl::Span<const SequenceInput> seqs, ExpertClient* experts,
                       std::vector<Sequence*>* owned, std::vector<SequenceTokens>* tokens);
  // Forward (the last positions' logits) or ForwardAllPositions.
  absl::StatusOr<std::vector<float>> Logits(absl::Span<const SequenceInput> seqs,
                                            ExpertClient* experts, bool all_positions);

  mutable absl::Mutex mu_;
  const std::unique_ptr<CudaModel> model_ ABSL_PT_GUARDED_BY(mu_);
  const std::string device_;
  const bool has_experts_;
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_CUDA_ATTENTION_BACKEND_H_
