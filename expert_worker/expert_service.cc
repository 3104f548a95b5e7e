#include "expert_worker/expert_service.h"

#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/rpc/grpc_util.h"

namespace moesh {

ExpertService::ExpertService(std::unique_ptr<ExpertStage> stage, std::string fingerprint,
                             ExpertServiceOptions options)
    : stage_(std::move(stage)), fingerprint_(std::move(fingerprint)), options_(options) {
  {
    absl::MutexLock lock(&mu_);
    expert_load_.assign(stage_->config().n_routed_experts, 0);
  }
  SetHosted();
  if (Metrics* m = options.metrics) {
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

void ExpertService::Record(const MoeDispatch& d, double seconds, size_t num_requests) {
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
  dispatches_counter_->Increment(static_cast<double>(num_requests));
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

absl::Status ExpertService::Validate(const v1::DispatchRequest& r) const {
  const int64_t n = r.num_tokens();
  if (n < 0 || r.top_k() <= 0 || r.hidden() <= 0)
    return absl::InvalidArgumentError("dispatch with bad dimensions");
  if (r.hidden_states().size() != static_cast<size_t>(n) * r.hidden() * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat("dispatch hidden_states holds ",
                                                   r.hidden_states().size(), " bytes, expected ",
                                                   n * r.hidden() * 4));
  }
  if (r.topk_ids_size() != n * r.top_k() || r.topk_weights_size() != n * r.top_k()) {
    return absl::InvalidArgumentError(
        "dispatch topk_ids/topk_weights do not match num_tokens * top_k");
  }
  if (!stage_->IsMoeLayer(r.layer())) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", r.layer(), " is not an MoE layer"));
  }
  // Every pair sent here must be served here: a pair of an expert this
  // worker no longer hosts (a stale map) would otherwise go missing.
  std::shared_ptr<const std::vector<bool>> hosted;
  {
    absl::MutexLock lock(&hosted_mu_);
    hosted = hosted_;
  }
  for (int32_t e : r.topk_ids()) {
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

absl::Status ExpertService::Dispatch(const v1::DispatchRequest& request,
                                     v1::DispatchResponse* response) {
  if (absl::Status s = Validate(request); !s.ok()) return s;
  std::shared_ptr<Batch> batch;
  bool leader = false;
  const auto arrived = std::chrono::steady_clock::now();
  {
    absl::MutexLock lock(&mu_);
    ++dispatches_;
    if (in_flight_++ > 0) last_overlap_ = arrived;
    auto it = open_.find(request.layer());
    if (it != open_.end() && !it->second->started &&
        it->second->requests.front()->top_k() == request.top_k() &&
        it->second->requests.front()->hidden() == request.hidden()) {
      batch = it->second;
    } else {
      batch = std::make_shared<Batch>();
      open_[request.layer()] = batch;
      leader = true;
    }
    batch->requests.push_back(&request);
    batch->responses.push_back(response);
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
    auto it = open_.find(request.layer());
    if (it != open_.end() && it->second == batch) open_.erase(it);
    ++batches_;
    if (wait) solo_streak_ = batch->requests.size() == 1 ? solo_streak_ + 1 : 0;
  }
  // The batch is closed: its vectors are no longer touched by joiners.
  absl::Status status = RunBatch(batch.get());
  absl::MutexLock lock(&mu_);
  batch->status = status;
  batch->done = true;
  --in_flight_;
  return status;
}

absl::Status ExpertService::DispatchOnDevice(const DeviceMoeDispatch& d, float* out) {
  if (!stage_->IsMoeLayer(d.layer))
    return absl::InvalidArgumentError(absl::StrCat("layer ", d.layer, " is not an MoE layer"));
  std::vector<CountedDispatch> counted;
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(stage_->AccumulateOnDevice(d, out, &counted));
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

absl::Status ExpertService::RunBatch(Batch* batch) {
  const v1::DispatchRequest& first = *batch->requests.front();
  const int hidden = first.hidden();
  const int top_k = first.top_k();
  int total = 0;
  for (const v1::DispatchRequest* r : batch->requests) total += r->num_tokens();
  std::vector<float> x(static_cast<size_t>(total) * hidden);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  ids.reserve(static_cast<size_t>(total) * top_k);
  weights.reserve(static_cast<size_t>(total) * top_k);
  size_t offset = 0;
  for (const v1::DispatchRequest* r : batch->requests) {
    std::memcpy(x.data() + offset, r->hidden_states().data(), r->hidden_states().size());
    offset += static_cast<size_t>(r->num_tokens()) * hidden;
    ids.insert(ids.end(), r->topk_ids().begin(), r->topk_ids().end());
    weights.insert(weights.end(), r->topk_weights().begin(), r->topk_weights().end());
  }
  MoeDispatch d;
  d.layer = first.layer();
  d.num_tokens = total;
  d.hidden = hidden;
  d.top_k = top_k;
  d.hidden_states = x.data();
  d.topk_ids = ids.data();
  d.topk_weights = weights.data();
  std::vector<float> out(static_cast<size_t>(total) * hidden, 0.0f);
  const auto start = std::chrono::steady_clock::now();
  if (absl::Status s = stage_->Accumulate(d, out.data()); !s.ok()) return s;
  Record(d, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
         batch->requests.size());
  offset = 0;
  for (size_t i = 0; i < batch->requests.size(); ++i) {
    const size_t n = static_cast<size_t>(batch->requests[i]->num_tokens()) * hidden;
    batch->responses[i]->mutable_output()->assign(
        reinterpret_cast<const char*>(out.data() + offset), n * sizeof(float));
    offset += n;
  }
  return absl::OkStatus();
}

grpc::Status ExpertService::Info(grpc::ServerContext*, const v1::ExpertInfoRequest*,
                                 v1::ExpertInfoResponse* response) {
  for (int e : stage_->expert_ids()) response->add_expert_ids(e);
  response->set_model_fingerprint(fingerprint_);
  response->set_data_plane_address(data_plane_address_);
  return grpc::Status::OK;
}

grpc::Status ExpertService::LoadExperts(grpc::ServerContext*, const v1::LoadExpertsRequest* request,
                                        v1::LoadExpertsResponse* response) {
  if (!options_.loader)
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "this worker cannot load experts");
  absl::MutexLock serial(&load_mu_);
  const std::set<int> hosted = stage_->expert_ids();
  std::set<int> add, listed;
  for (int e : request->expert_ids()) {
    if (e < 0 || e >= stage_->config().n_routed_experts) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("expert ", e, " does not exist"));
    }
    listed.insert(e);
    if (!hosted.count(e)) add.insert(e);
  }
  if (request->exact() && listed.empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "an exact expert set must name at least one expert");
  }
  if (!add.empty()) {
    absl::StatusOr<std::unique_ptr<ExpertShardWeights>> w = options_.loader(add);
    if (!w.ok()) return ToGrpcStatus(w.status());
    if (absl::Status s = stage_->AddShard(std::move(*w)); !s.ok()) return ToGrpcStatus(s);
    SetHosted();
    std::cerr << "expert worker: now also serving " << add.size() << " more experts" << std::endl;
  }
  std::set<int> drop;
  if (request->exact()) {
    for (int e : hosted) {
      if (!listed.count(e)) drop.insert(e);
    }
  }
  if (!drop.empty()) {
    SetHosted(drop);  // refused from now on, before their weights go
    if (absl::Status s = stage_->RemoveExperts(drop); !s.ok()) {
      SetHosted();
      return ToGrpcStatus(s);
    }
    std::cerr << "expert worker: no longer serving " << drop.size()
              << " experts (replicas the placement dropped)" << std::endl;
  }
  for (int e : stage_->expert_ids()) response->add_expert_ids(e);
  return grpc::Status::OK;
}

void ExpertService::SetHosted(const std::set<int>& leaving) {
  auto hosted = std::make_shared<std::vector<bool>>(stage_->config().n_routed_experts, false);
  for (int e : stage_->expert_ids()) (*hosted)[e] = !leaving.count(e);
  absl::MutexLock lock(&hosted_mu_);
  hosted_ = std::move(hosted);
}

v1::WorkerLoad ExpertService::Load() const {
  v1::WorkerLoad load;
  absl::MutexLock lock(&mu_);
  load.mutable_expert_tokens()->Add(expert_load_.begin(), expert_load_.end());
  return load;
}

int64_t ExpertService::num_batches() const {
  absl::MutexLock lock(&mu_);
  return batches_;
}

int64_t ExpertService::num_dispatches() const {
  absl::MutexLock lock(&mu_);
  return dispatches_;
}

}  // namespace moesh
