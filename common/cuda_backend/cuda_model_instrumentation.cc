// CudaModel's instrumentation for tests and benchmarks: synthetic caches,
// the routing and expert counts of the last pass and per-phase
// timings. The serving path (cuda_model.cc) does not use them.
#include <algorithm>

#include "common/cuda_backend/cuda_model.h"
#include "kernels/cuda/fill.h"

namespace moesh::cuda {

absl::Status CudaModel::FillKvCacheRandom(uint64_t seed) {
  const KvRowSpec& row = kv_->row();
  if (row.fp8()) {
    RETURN_IF_ERROR(FillFp8KvRows(
        kv_->layer(0), static_cast<size_t>(kv_->num_layers()) * kv_->num_blocks() * kKvBlockSize,
        row.latent, row.rope, seed, 1.0f, stream_.get()));
  } else {
    RETURN_IF_ERROR(
        FillUniform(kv_->layer(0), kv_->bytes() / sizeof(bf16), seed, 1.0f, stream_.get()));
  }
  RETURN_IF_ERROR(stack_->FillCacheRandom(seed + 1));  // V4's compressed entries
  return stream_.Synchronize();
}

absl::StatusOr<std::vector<int>> CudaModel::AddSyntheticSequences(int n, int length) {
  if (n < 0 || length < 0 || length > max_model_len_) {
    return absl::InvalidArgumentError(
        "CudaModel::AddSyntheticSequences: need n >= 0 and length <= max_model_len");
  }
  std::vector<int> ids;
  for (int i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(const int id, AddSequence());
    Sequence& s = store_->at(id);
    RETURN_IF_ERROR(store_->Cover(&s, length));
    s.length = length;
    ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<std::vector<int32_t>> CudaModel::LastRouting(int* rows) {
  return ffn_->Routing(rows);
}

absl::StatusOr<PhaseTimes> CudaModel::ProfileStep(absl::Span<const SequenceTokens> seqs) {
  if (!options_.routed_experts_on_device) {
    return absl::FailedPreconditionError(
        "CudaModel::ProfileStep: the routed experts are not on this device");
  }
  std::vector<StepBatch> chunks;
  std::vector<int> order;
  RETURN_IF_ERROR(planner_->Plan(seqs, store_.get(), &chunks, &order));
  const int layers = config_.num_hidden_layers;
  std::vector<Event> events;
  for (int i = 0; i < 3 + 2 * layers; ++i) {
    ASSIGN_OR_RETURN(Event e, Event::Create());
    events.push_back(std::move(e));
  }
  PhaseTimes t;
  for (const StepBatch& b : chunks) {
    RETURN_IF_ERROR(planner_->Upload(b, stream_.get(), stack_->needs_segments()));
    ctx_->profile = &events;
    absl::Status st = events[0].Record(stream_.get());
    if (st.ok()) st = EnqueueForward(b, true, 0);
    ctx_->profile = nullptr;
    RETURN_IF_ERROR(st);
    RETURN_IF_ERROR(stream_.Synchronize());
    auto ms = [&](int a, int z) -> absl::StatusOr<double> {
      ASSIGN_OR_RETURN(float v, events[z].ElapsedMsSince(events[a]));
      return static_cast<double>(v);
    };
    ASSIGN_OR_RETURN(double embed, ms(0, 1));
    t.embed_ms += embed;
    for (int l = 0; l < layers; ++l) {
      ASSIGN_OR_RETURN(double attn, ms(l == 0 ? 1 : 1 + 2 * l, 2 + 2 * l));
      ASSIGN_OR_RETURN(double mlp, ms(2 + 2 * l, 3 + 2 * l));
      t.attention_ms += attn;
      (weights_->layer(l).is_moe ? t.moe_ms : t.dense_mlp_ms) += mlp;
    }
    ASSIGN_OR_RETURN(double head, ms(1 + 2 * layers, 2 + 2 * layers));
    ASSIGN_OR_RETURN(double total, ms(0, 2 + 2 * layers));
    t.head_ms += head;
    t.total_ms += total;
  }
  RETURN_IF_ERROR(Commit(seqs));
  return t;
}

absl::StatusOr<std::vector<int32_t>> CudaModel::LastExpertCounts() { return ffn_->ExpertCounts(); }

}  // namespace moesh::cuda
