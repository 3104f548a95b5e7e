#include "common/engine/attention_backend.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/engine/paged_kv_cache.h"

namespace moesh {

absl::Status CheckPrompt(const AttentionBackend& backend, absl::Span<const int32_t> prompt,
                         int prompt_logprobs) {
  const int vocab = backend.config().vocab_size;
  for (int32_t t : prompt) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t, " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  if (prompt_logprobs >= 0 && !backend.has_all_position_logits()) {
    return absl::UnimplementedError(
        absl::StrCat("prompt_logprobs: the ", backend.device(),
                     " backend computes the logits of each prompt's last position only"));
  }
  return absl::OkStatus();
}

absl::Status AttentionBackend::CheckSampleRequests(absl::Span<const SequenceInput> seqs,
                                                   absl::Span<const SampleRequest> samples,
                                                   int top_logprobs) const {
  const int vocab = config().vocab_size;
  if (samples.size() != seqs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardSample: ", samples.size(), " sample requests for ", seqs.size(), " sequences"));
  }
  if (top_logprobs < 0 || top_logprobs > vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("ForwardSample: top_logprobs must lie in [0, ", vocab, "]"));
  }
  for (const SampleRequest& s : samples) {
    if (s.prompt_logprobs < -1 || s.prompt_logprobs > vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("ForwardSample: prompt_logprobs must lie in [-1, ", vocab, "]"));
    }
    if (s.prompt_next < -1 || s.prompt_next >= vocab ||
        (s.prompt_next >= 0 && s.prompt_logprobs < 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ForwardSample: prompt_next ", s.prompt_next,
          " must be -1 or, with prompt_logprobs, a token of the vocabulary [0, ", vocab, ")"));
    }
    if (s.params == nullptr)
      return absl::InvalidArgumentError("ForwardSample: a sample request without parameters");
    RETURN_IF_ERROR(s.params->Validate(vocab));
    if (!(s.draw >= 0.0 && s.draw < 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("ForwardSample: draw ", s.draw, " outside [0, 1)"));
    }
    if (!s.params->has_penalties()) continue;  // only the penalties read the tokens
    for (absl::Span<const int32_t> toks : {s.prompt, s.output}) {
      for (int32_t t : toks) {
        if (t < 0 || t >= vocab)
          return absl::InvalidArgumentError(
              absl::StrCat("ForwardSample: token ", t, " outside the vocabulary"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> AttentionBackend::ForwardAllPositions(
    absl::Span<const SequenceInput>, ExpertClient*) {
  return absl::UnimplementedError(
      absl::StrCat("prompt log-probabilities: the ", device(),
                   " backend computes the logits of each sequence's last position only"));
}

absl::StatusOr<SampledTokens> AttentionBackend::ForwardSample(
    absl::Span<const SequenceInput> seqs, ExpertClient* experts,
    absl::Span<const SampleRequest> samples, int top_logprobs, int micro_batches) {
  RETURN_IF_ERROR(CheckSampleRequests(seqs, samples, top_logprobs));
  const bool all_positions =
      std::any_of(samples.begin(), samples.end(),
                  [](const SampleRequest& s) { return s.prompt_logprobs >= 0; });
  const int vocab = config().vocab_size;
  std::vector<float> logits;
  std::vector<size_t> last_row(seqs.size());  // each sequence's last position's row
  if (all_positions) {
    ASSIGN_OR_RETURN(logits, ForwardAllPositions(seqs, experts));
    size_t row = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
      row += seqs[i].tokens.size();
      last_row[i] = row - 1;
    }
  } else {
    ASSIGN_OR_RETURN(logits, Forward(seqs, experts, micro_batches));
    for (size_t i = 0; i < seqs.size(); ++i) last_row[i] = i;
  }
  SampledTokens out;
  out.prompt_logprobs.resize(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    const float* row = logits.data() + last_row[i] * vocab;
    const SampleRequest& s = samples[i];
    const int32_t id = Sampler::SampleWithDraw(row, vocab, *s.params, s.draw, s.prompt, s.output);
    out.ids.push_back(id);
    out.logprobs.push_back(s.params->wants_logprob() ? Sampler::Logprob(row, vocab, id) : 0.0f);
    if (top_logprobs > 0)
      out.top_logprobs.push_back(Sampler::TopLogprobs(row, vocab, top_logprobs));
    if (s.prompt_logprobs >= 0) {
      const size_t first = last_row[i] + 1 - seqs[i].tokens.size();
      std::vector<int32_t> scored(seqs[i].tokens.begin(), seqs[i].tokens.end());
      if (s.prompt_next >= 0) scored.push_back(s.prompt_next);  // the last row scores it
      out.prompt_logprobs[i] = Sampler::PromptLogprobsOf(logits.data() + first * vocab, vocab,
                                                         scored, s.prompt_logprobs);
    }
  }
  return out;
}

namespace {

class CpuAttentionBackend : public AttentionBackend {
 public:
  CpuAttentionBackend(const AttentionModel* model, std::unique_ptr<AttentionModel> owned,
                      int num_kv_blocks, int block_size, bool prefix_cache, KvRowFormat kv_format)
      : owned_(std::move(owned)), model_(model), kv_format_(kv_format) {
    if (num_kv_blocks > 0) {
      pool_ =
          std::make_unique<KvBlockPool>(model->config().num_hidden_layers, model->kv_row_width(),
                                        block_size, num_kv_blocks, prefix_cache, kv_format);
    }
  }

  const ModelConfig& config() const override { return model_->config(); }
  std::string device() const override { return "cpu"; }

  absl::StatusOr<std::unique_ptr<KvSequence>> NewSequence(int max_tokens) override {
    return NewCachedSequence(max_tokens, {});
  }

  absl::StatusOr<std::unique_ptr<KvSequence>> NewCachedSequence(
      int max_tokens, absl::Span<const int32_t> tokens) override {
    const ModelConfig& c = model_->config();
    if (max_tokens < 0 ||
        (c.max_position_embeddings > 0 && max_tokens > c.max_position_embeddings)) {
      return absl::InvalidArgumentError(absl::StrCat("a sequence of ", max_tokens,
                                                     " tokens exceeds the model's context of ",
                                                     c.max_position_embeddings, " tokens"));
    }
    if (pool_ == nullptr) {
      return std::make_unique<SequenceKvCache>(c.num_hidden_layers, model_->kv_row_width(),
                                               kv_format_);
    }
    ASSIGN_OR_RETURN(std::unique_ptr<PagedKvSequence> seq, pool_->Allocate(max_tokens, tokens));
    return std::unique_ptr<KvSequence>(std::move(seq));
  }

  PrefixCacheStats prefix_cache_stats() const override {
    return pool_ != nullptr ? pool_->stats() : PrefixCacheStats();
  }

  std::vector<uint64_t> CachedBlockHashes(int max) const override {
    return pool_ != nullptr ? pool_->CachedHashes(max) : std::vector<uint64_t>();
  }

  absl::StatusOr<std::vector<float>> Forward(absl::Span<const SequenceInput> seqs,
                                             ExpertClient* experts, int micro_batches) override {
    if (experts == nullptr)
      return absl::InvalidArgumentError("the CPU attention backend needs an ExpertClient");
    return model_->Forward(seqs, experts, LogitsFor::kLastToken, micro_batches);
  }

  absl::StatusOr<std::vector<float>> ForwardAllPositions(absl::Span<const SequenceInput> seqs,
                                                         ExpertClient* experts) override {
    if (experts == nullptr)
      return absl::InvalidArgumentError("the CPU attention backend needs an ExpertClient");
    return model_->Forward(seqs, experts, LogitsFor::kAllTokens);
  }
  bool has_all_position_logits() const override { return true; }

  KvUsage kv_usage() const override {
    KvUsage u;
    if (pool_ != nullptr) {
      u.total_blocks = pool_->num_blocks();
      u.free_blocks = pool_->free_blocks();
      u.block_size = pool_->block_size();
    }
    return u;
  }

 private:
  const std::unique_ptr<AttentionModel> owned_;  // null if borrowed
  const AttentionModel* const model_;
  const KvRowFormat kv_format_;
  std::unique_ptr<KvBlockPool> pool_;  // null: unbounded caches
};

}  // namespace

std::unique_ptr<AttentionBackend> NewCpuAttentionBackend(std::unique_ptr<AttentionModel> model,
                                                         int num_kv_blocks, int block_size,
                                                         bool prefix_cache, KvRowFormat kv_format) {
  const AttentionModel* m = model.get();
  return std::make_unique<CpuAttentionBackend>(m, std::move(model), num_kv_blocks, block_size,
                                               prefix_cache, kv_format);
}

std::unique_ptr<AttentionBackend> NewCpuAttentionBackend(const AttentionModel* model,
                                                         int num_kv_blocks, int block_size,
                                                         bool prefix_cache, KvRowFormat kv_format) {
  return std::make_unique<CpuAttentionBackend>(model, nullptr, num_kv_blocks, block_size,
                                               prefix_cache, kv_format);
}

}  // namespace moesh
