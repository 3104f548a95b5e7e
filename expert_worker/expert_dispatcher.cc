#include "expert_worker/expert_dispatcher.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/status.h"

namespace moesh {

ExpertDispatcher::ExpertDispatcher(std::unique_ptr<ExpertStage> stage,
                                   ExpertDispatcherOptions options)
    : stage_(std::move(stage)), options_(std::move(options)) {
  {
    absl::MutexLock lock(&mu_);
    expert_load_.assign(stage_->config().n_routed_experts, 0);
  }
  SetHosted();
  if (Metrics* m = options_.metrics) {
    expert_tokens_family_ = &m->CounterFamily("moesh_expert_tokens_total",
                                              "Tokens routed to each hosted expert, per layer.");
    absl::MutexLock lock(&counters_mu_);
    for (int layer : stage_->moe_layers()) {
      for (int e : stage_->expert_ids()) {
        expert_tokens_[{layer, e}] = &expert_tokens_family_->Add(
            {{"layer", std::to_string(layer)}, {"expert", std::to_string(e)}});
      }
    }
    compute_seconds_ =
        &m->HistogramFamily("moesh_expert_compute_seconds",
                            "Wall time of one grouped expert computation (a merged batch).")
             .Add({}, Metrics::LatencyBuckets());
    batches_counter_ =
        &m->CounterFamily("moesh_expert_batches_total", "Grouped expert computations run.").Add({});
    dispatches_counter_ = &m->CounterFamily("moesh_expert_dispatches_total",
                                            "Dispatch messages served (merged into batches).")
                               .Add({});
  }
}

void ExpertDispatcher::Record(const MoeDispatch& d, double seconds, size_t num_dispatches) {
  // Tokens per expert first (a dispatch's pairs touch few experts many
  // times): one counter update per expert, not per pair. This runs before
  // the dispatch is answered, once per MoE layer.
  const int num_experts = stage_->config().n_routed_experts;
  std::vector<int32_t> counts(num_experts, 0);
  for (int i = 0; i < d.num_tokens * d.top_k; ++i) {
    const int e = d.topk_ids[i];
    if (e >= 0 && e < num_experts) ++counts[e];
  }
  {
    absl::MutexLock lock(&mu_);
    for (int e = 0; e < num_experts && e < static_cast<int>(expert_load_.size()); ++e)
      expert_load_[e] += counts[e];
  }
  if (compute_seconds_ == nullptr) return;
  compute_seconds_->Observe(seconds);
  batches_counter_->Increment();
  dispatches_counter_->Increment(static_cast<double>(num_dispatches));
  absl::MutexLock lock(&counters_mu_);
  for (int e = 0; e < num_experts; ++e) {
    if (counts[e] == 0) continue;
    auto it = expert_tokens_.find({d.layer, e});
    if (it == expert_tokens_.end()) {  // a replica loaded since start
      it = expert_tokens_
               .emplace(std::make_pair(d.layer, e),
                        &expert_tokens_family_->Add(
                            {{"layer", std::to_string(d.layer)}, {"expert", std::to_string(e)}}))
               .first;
    }
    it->second->Increment(counts[e]);
  }
}

absl::Status ExpertDispatcher::Validate(const MoeDispatch& d) const {
  RETURN_IF_ERROR(CheckDispatchMemory(d, MemoryKinds(), "the expert worker's batching"));
  if (d.num_tokens < 0 || d.top_k <= 0 || d.hidden <= 0)
    return absl::InvalidArgumentError("dispatch with bad dimensions");
  if (!stage_->IsMoeLayer(d.layer)) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", d.layer, " is not an MoE layer"));
  }
  // Every pair sent here must be served here: a pair of an expert this
  // worker no longer hosts (a stale map) would otherwise go missing.
  std::shared_ptr<const std::vector<bool>> hosted;
  {
    absl::MutexLock lock(&hosted_mu_);
    hosted = hosted_;
  }
  for (int64_t i = 0; i < static_cast<int64_t>(d.num_tokens) * d.top_k; ++i) {
    const int32_t e = d.topk_ids[i];
    if (e >= stage_->config().n_routed_experts) {
      return absl::InvalidArgumentError(absl::StrCat("expert id ", e, " out of range"));
    }
    if (e >= 0 && !(*hosted)[e]) {
      return absl::FailedPreconditionError(absl::StrCat(
          "expert ", e, " is not hosted here (the placement moved; route by the new map)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ExpertDispatcher::Dispatch(const MoeDispatch& d, float* out) {
  if (!d.memory.is_host()) return DispatchOnDevice(d, out);
  if (absl::Status s = Validate(d); !s.ok()) return s;
  std::shared_ptr<Batch> batch;
  bool leader = false;
  const auto arrived = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&mu_);
    ++dispatches_;
    if (in_flight_++ > 0) last_overlap_ = arrived;
    auto it = open_.find(d.layer);
    if (it != open_.end() && !it->second->started &&
        it->second->dispatches.front()->top_k == d.top_k &&
        it->second->dispatches.front()->hidden == d.hidden) {
      batch = it->second;
    } else {
      batch = std::make_shared<Batch>();
      open_[d.layer] = batch;
      leader = true;
    }
    batch->dispatches.push_back(&d);
    batch->outs.push_back(out);
  }
  if (!leader) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Batch* b) { return b->done; }, batch.get()));
    --in_flight_;
    return batch->status;
  }
  bool wait;
  {
    absl::MutexLock lock(&mu_);
    wait =
        solo_streak_ < options_.solo_batches || arrived - last_overlap_ < std::chrono::seconds(1);
  }
  if (wait) absl::SleepFor(absl::FromChrono(options_.batch_window));
  {
    absl::MutexLock lock(&mu_);
    batch->started = true;
    auto it = open_.find(d.layer);
    if (it != open_.end() && it->second == batch) open_.erase(it);
    ++batches_;
    if (wait) solo_streak_ = batch->dispatches.size() == 1 ? solo_streak_ + 1 : 0;
  }
  // The batch is closed: its vectors are no longer touched by joiners.
  absl::Status status = RunBatch(batch.get());
  absl::MutexLock lock(&mu_);
  batch->status = status;
  batch->done = true;
  --in_flight_;
  return status;
}

absl::Status ExpertDispatcher::DispatchOnDevice(const MoeDispatch& d, float* out) {
  if (!stage_->IsMoeLayer(d.layer))
    return absl::InvalidArgumentError(absl::StrCat("layer ", d.layer, " is not an MoE layer"));
  std::vector<CountedDispatch> counted;
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(stage_->Accumulate(d, out, &counted));
  // Host time of the call (with d.done: until the work is enqueued).
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    absl::MutexLock lock(&mu_);
    ++dispatches_;
    ++batches_;
  }
  // The dispatches whose pairs are known now (this one, or an earlier one
  // that returned before the device finished).
  for (const CountedDispatch& c : counted) {
    MoeDispatch m;
    m.layer = c.layer, m.num_tokens = c.ids.empty() ? 0 : c.num_tokens, m.hidden = d.hidden,
    m.top_k = c.top_k;
    m.topk_ids = c.ids.data();
    Record(m, seconds, 1);
  }
  return absl::OkStatus();
}

absl::Status ExpertDispatcher::RunBatch(Batch* batch) {
  const MoeDispatch& first = *batch->dispatches.front();
  const int hidden = first.hidden;
  const int top_k = first.top_k;
  int total = 0;
  for (const MoeDispatch* d : batch->dispatches) total += d->num_tokens;
  MoeDispatch merged;
  std::vector<float> x;
  std::vector<int32_t> ids;
  std::vector<float> weights;
  if (batch->dispatches.size() == 1) {
    merged = first;  // nothing to gather
  } else {
    x.resize(static_cast<size_t>(total) * hidden);
    ids.reserve(static_cast<size_t>(total) * top_k);
    weights.reserve(static_cast<size_t>(total) * top_k);
    size_t offset = 0;
    for (const MoeDispatch* d : batch->dispatches) {
      const size_t n = static_cast<size_t>(d->num_tokens);
      std::copy(d->hidden_f32(), d->hidden_f32() + n * hidden, x.data() + offset);
      offset += n * hidden;
      ids.insert(ids.end(), d->topk_ids, d->topk_ids + n * top_k);
      weights.insert(weights.end(), d->topk_weights, d->topk_weights + n * top_k);
    }
    merged.layer = first.layer;
    merged.num_tokens = total;
    merged.hidden = hidden;
    merged.top_k = top_k;
    merged.hidden_states = x.data();
    merged.topk_ids = ids.data();
    merged.topk_weights = weights.data();
  }
  std::vector<float> out(static_cast<size_t>(total) * hidden, 0.0f);
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status s = stage_->Accumulate(merged, out.data()); !s.ok()) return s;
  Record(merged, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
         batch->dispatches.size());
  size_t offset = 0;
  for (size_t i = 0; i < batch->dispatches.size(); ++i) {
    const size_t n = static_cast<size_t>(batch->dispatches[i]->num_tokens) * hidden;
    std::copy(out.data() + offset, out.data() + offset + n, batch->outs[i]);
    offset += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::set<int>> ExpertDispatcher::LoadExperts(const std::vector<int>& ids,
                                                            bool exact) {
  if (!options_.loader) return absl::UnimplementedError("this worker cannot load experts");
  absl::MutexLock serial(&load_mu_);
  const std::set<int> hosted = stage_->expert_ids();
  std::set<int> add, listed;
  const int num_experts = stage_->config().n_routed_experts;
  for (int e : ids) {
    if (e < 0 || e >= num_experts) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expert_ids: expert ", e, " does not exist (ids lie in [0, ", num_experts, "))"));
    }
    listed.insert(e);
    if (!hosted.count(e)) add.insert(e);
  }
  if (exact && listed.empty()) {
    return absl::InvalidArgumentError("an exact expert set must name at least one expert");
  }
  std::set<int> drop;
  if (exact) {
    for (int e : hosted) {
      if (!listed.count(e)) drop.insert(e);
    }
  }
  if (!drop.empty() && options_.may_drop) RETURN_IF_ERROR(options_.may_drop(drop));
  if (!add.empty()) {
    ASSIGN_OR_RETURN(std::unique_ptr<ExpertShardWeights> w, options_.loader(add));
    RETURN_IF_ERROR(stage_->AddShard(std::move(w)));
    SetHosted();
    std::cerr << "expert worker: now also serving " << add.size() << " more experts" << std::endl;
  }
  if (!drop.empty()) {
    SetHosted(drop);  // refused from now on, before their weights go
    if (absl::Status s = stage_->RemoveExperts(drop); !s.ok()) {
      SetHosted();
      return s;
    }
    std::cerr << "expert worker: no longer serving " << drop.size()
              << " experts (replicas the placement dropped)" << std::endl;
  }
  return stage_->expert_ids();
}

void ExpertDispatcher::SetHosted(const std::set<int>& leaving) {
  auto hosted = std::make_shared<std::vector<bool>>(stage_->config().n_routed_experts, false);
  for (int e : stage_->expert_ids()) (*hosted)[e] = !leaving.count(e);
  absl::MutexLock lock(&hosted_mu_);
  hosted_ = std::move(hosted);
}

std::vector<int64_t> ExpertDispatcher::expert_load() const {
  absl::MutexLock lock(&mu_);
  return expert_load_;
}

int64_t ExpertDispatcher::num_batches() const {
  absl::MutexLock lock(&mu_);
  return batches_;
}

int64_t ExpertDispatcher::num_dispatches() const {
  absl::MutexLock lock(&mu_);
  return dispatches_;
}

}  // namespace moesh
