#include "router/membership.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <iostream>
#include <numeric>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "router/eplb.h"

namespace moesh {
namespace {

// Load per expert = what every expert worker reported serving for it.
struct ExpertLoad {
  std::vector<double> load;   // tokens per expert
  std::vector<int> replicas;  // hosts per expert
  size_t most = 0;            // experts on the busiest host
};

ExpertLoad Tally(const std::vector<WorkerInfo>& experts) {
  int num_experts = 0;
  for (const WorkerInfo& w : experts) {
    num_experts = std::max(num_experts, w.load.expert_tokens_size());
    for (int e : w.expert_ids) num_experts = std::max(num_experts, e + 1);
  }
  ExpertLoad t;
  t.load.assign(num_experts, 0.0);
  t.replicas.assign(num_experts, 0);
  for (const WorkerInfo& w : experts) {
    for (int e = 0; e < w.load.expert_tokens_size(); ++e)
      t.load[e] += static_cast<double>(w.load.expert_tokens(e));
    for (int e : w.expert_ids) ++t.replicas[e];
    t.most = std::max(t.most, w.expert_ids.size());
  }
  return t;
}

// The busiest worker's share over the mean share (an expert's tokens split
// evenly over its replicas); 1 without load.
double BalanceRatio(const std::vector<WorkerInfo>& experts, const ExpertLoad& t) {
  std::vector<double> share(experts.size(), 0.0);
  for (size_t w = 0; w < experts.size(); ++w) {
    for (int e : experts[w].expert_ids) share[w] += t.load[e] / std::max(t.replicas[e], 1);
  }
  const double total = std::accumulate(share.begin(), share.end(), 0.0);
  return total > 0 ? *std::max_element(share.begin(), share.end()) / (total / share.size()) : 1.0;
}

}  // namespace

Membership::Membership(std::string model_fingerprint, std::chrono::milliseconds heartbeat_interval,
                       std::chrono::milliseconds timeout, RebalancePolicy rebalance,
                       Metrics* metrics)
    : fingerprint_(std::move(model_fingerprint)),
      interval_(heartbeat_interval),
      timeout_(timeout),
      policy_(rebalance) {
  if (metrics != nullptr) {
    auto& count = metrics->CounterFamily(
        "moesh_rebalances_total", "Expert placement rebalances, by result (ok: the map switched).");
    rebalances_ok_ = &count.Add({{"result", "ok"}});
    rebalances_failed_ = &count.Add({{"result", "failed"}});
    rebalance_seconds_ =
        &metrics
             ->HistogramFamily("moesh_rebalance_seconds",
                               "Wall time of one rebalance, replicas loaded and map switched.")
             .Add({}, Metrics::LatencyBuckets());
    balance_ratio_ =
        &metrics
             ->GaugeFamily("moesh_expert_worker_balance_ratio",
                           "Busiest expert worker's share of routed tokens over the mean share.")
             .Add({});
    balance_ratio_->Set(1.0);
    replicas_dropped_ =
        &metrics
             ->CounterFamily(
                 "moesh_expert_replicas_dropped_total",
                 "Expert replicas dropped after rebalances (the map no longer routed to "
                 "them and every attention worker followed it).")
             .Add({});
  }
  sweeper_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(absl::FromChrono(interval_))) Sweep();
  });
  if (policy_.interval.count() > 0) rebalancer_ = std::thread([this] { AutoRebalance(); });
}

Membership::~Membership() {
  stop_.Notify();
  sweeper_.join();
  if (rebalancer_.joinable()) rebalancer_.join();
}

std::vector<double> Membership::LoadSinceBaseline(const std::vector<double>& total) const {
  absl::MutexLock lock(&mu_);
  std::vector<double> since = total;
  for (size_t e = 0; e < since.size() && e < load_baseline_.size(); ++e) {
    if (total[e] >= load_baseline_[e]) since[e] -= load_baseline_[e];
  }
  return since;
}

double Membership::ExpertBalanceRatio() const {
  const std::vector<WorkerInfo> experts = Live(v1::WORKER_KIND_EXPERT);
  ExpertLoad tally = Tally(experts);
  tally.load = LoadSinceBaseline(tally.load);
  return BalanceRatio(experts, tally);
}

void Membership::AutoRebalance() {
  while (!stop_.WaitForNotificationWithTimeout(absl::FromChrono(policy_.interval))) {
    const double ratio = ExpertBalanceRatio();
    if (balance_ratio_ != nullptr) balance_ratio_->Set(ratio);
    if (ratio <= policy_.min_ratio) continue;
    absl::StatusOr<v1::RebalanceResponse> r = RunRebalance(policy_.slots_per_worker);
    if (!r.ok()) std::cerr << "router: automatic rebalance failed: " << r.status() << std::endl;
  }
}

grpc::Status Membership::Register(grpc::ServerContext*, const v1::RegisterRequest* request,
                                  v1::RegisterResponse* response) {
  if (request->model_fingerprint() != fingerprint_) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("worker serves ", request->model_fingerprint(), ", router ", fingerprint_));
  }
  if (request->kind() == v1::WORKER_KIND_UNSPECIFIED || request->address().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "registration needs a kind and an address");
  }
  std::vector<std::function<void()>> notify;
  {
    absl::MutexLock lock(&mu_);
    // A worker re-registering from the same address replaces its old self.
    for (auto it = workers_.begin(); it != workers_.end(); ++it) {
      if (it->second.info.address == request->address()) {
        Drop(it->first);
        break;
      }
    }
    Entry e;
    e.info.id = absl::StrCat(v1::WorkerKind_Name(request->kind()).substr(12), "-", ++next_id_);
    e.info.kind = request->kind();
    e.info.address = request->address();
    e.info.data_plane_address =
        request->data_plane_address().empty() ? request->address() : request->data_plane_address();
    e.info.expert_ids.assign(request->expert_ids().begin(), request->expert_ids().end());
    e.last_seen = std::chrono::steady_clock::now();
    response->set_worker_id(e.info.id);
    response->set_heartbeat_interval_ms(static_cast<int>(interval_.count()));
    std::cerr << "router: " << e.info.id << " joined at " << e.info.address << std::endl;
    if (e.info.kind == v1::WORKER_KIND_EXPERT) ++placement_version_;
    workers_[e.info.id] = std::move(e);
    notify = on_change_;
  }
  for (auto& f : notify) f();
  return grpc::Status::OK;
}

grpc::Status Membership::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                                   v1::HeartbeatResponse* response) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(request->worker_id());
  response->set_known(it != workers_.end());
  response->set_placement_version(placement_version_);
  if (it != workers_.end()) {
    it->second.last_seen = std::chrono::steady_clock::now();
    it->second.info.load = request->load();
    it->second.placement_version = request->placement_version();
  }
  return grpc::Status::OK;
}

void Membership::Drop(const std::string& id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  std::cerr << "router: dropping " << id << " at " << it->second.info.address << std::endl;
  if (it->second.info.kind == v1::WORKER_KIND_EXPERT) ++placement_version_;
  workers_.erase(it);
  for (auto& [handle, entry] : tracked_) {
    if (entry.first == id) to_cancel_.push_back(entry.second);
  }
}

void Membership::Sweep() {
  std::vector<std::function<void()>> cancel, notify;
  {
    absl::MutexLock lock(&mu_);
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::string> dead;
    for (auto& [id, e] : workers_) {
      if (now - e.last_seen > timeout_) dead.push_back(id);
    }
    for (const std::string& id : dead) Drop(id);
    cancel.swap(to_cancel_);
    if (!dead.empty()) notify = on_change_;
  }
  for (auto& f : cancel) f();
  for (auto& f : notify) f();
}

grpc::Status Membership::Deregister(grpc::ServerContext*, const v1::DeregisterRequest* request,
                                    v1::DeregisterResponse*) {
  std::vector<std::function<void()>> notify;
  {
    absl::MutexLock lock(&mu_);
    if (!workers_.count(request->worker_id())) return grpc::Status::OK;
    std::cerr << "router: " << request->worker_id() << " is leaving" << std::endl;
    Drop(request->worker_id());
    // Its in-flight calls drain on their own; nothing to cancel.
    to_cancel_.clear();
    notify = on_change_;
  }
  for (auto& f : notify) f();
  return grpc::Status::OK;
}

grpc::Status Membership::Rebalance(grpc::ServerContext*, const v1::RebalanceRequest* request,
                                   v1::RebalanceResponse* response) {
  absl::StatusOr<v1::RebalanceResponse> r = RunRebalance(request->slots_per_worker());
  if (!r.ok())
    return grpc::Status(static_cast<grpc::StatusCode>(r.status().code()),
                        std::string(r.status().message()));
  *response = std::move(*r);
  return grpc::Status::OK;
}

absl::StatusOr<v1::RebalanceResponse> Membership::RunRebalance(int slots_per_worker) {
  absl::MutexLock serial(&rebalance_mu_);
  const auto start = std::chrono::steady_clock::now();
  v1::RebalanceResponse out;
  v1::RebalanceResponse* response = &out;
  auto failed = [&](absl::Status s) {
    if (rebalances_failed_ != nullptr) rebalances_failed_->Increment();
    return s;
  };
  std::vector<WorkerInfo> experts = Live(v1::WORKER_KIND_EXPERT);
  if (experts.empty())
    return failed(absl::FailedPreconditionError("no expert workers are registered"));
  ExpertLoad tally = Tally(experts);
  const std::vector<double> totals = tally.load;
  tally.load = LoadSinceBaseline(totals);
  // Asked for: exactly that many (replicas beyond it are dropped); else as
  // many as the busiest worker hosts now.
  const int slots = slots_per_worker > 0 ? slots_per_worker : static_cast<int>(tally.most);
  absl::StatusOr<EplbPlan> plan =
      PlanExpertPlacement(tally.load, static_cast<int>(experts.size()), slots);
  if (!plan.ok()) return failed(absl::InvalidArgumentError(plan.status().message()));
  response->set_balance_ratio_before(BalanceRatio(experts, tally));
  response->set_balance_ratio_after(plan->balance_ratio);
  // Load the new replicas first; only then does the map change.
  std::map<std::string, std::vector<int>> hosted;  // worker id -> experts after
  for (size_t w = 0; w < experts.size(); ++w) {
    std::set<int> want(experts[w].expert_ids.begin(), experts[w].expert_ids.end());
    want.insert(plan->worker_experts[w].begin(), plan->worker_experts[w].end());
    v1::LoadExpertsRequest req;
    req.mutable_expert_ids()->Add(want.begin(), want.end());
    v1::LoadExpertsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
    auto stub = v1::ExpertWorker::NewStub(
        grpc::CreateChannel(experts[w].address, grpc::InsecureChannelCredentials()));
    grpc::Status s = stub->LoadExperts(&ctx, req, &resp);
    if (!s.ok()) {
      return failed(
          absl::UnavailableError(absl::StrCat(experts[w].id, " could not load its new experts (",
                                              s.error_message(), "); the map is unchanged")));
    }
    hosted[experts[w].id].assign(resp.expert_ids().begin(), resp.expert_ids().end());
  }
  // The map routes by the plan; what the workers host beyond it (replicas
  // of earlier plans) is dropped once nobody routes by an older map.
  int64_t version = 0;
  {
    absl::MutexLock lock(&mu_);
    for (size_t w = 0; w < experts.size(); ++w) {
      auto it = workers_.find(experts[w].id);
      if (it != workers_.end()) it->second.info.expert_ids = plan->worker_experts[w];
    }
    version = ++placement_version_;
    response->set_placement_version(placement_version_);
    load_baseline_ = totals;
  }
  DropColdReplicas(version, hosted, experts, plan->worker_experts);
  std::cerr << "router: rebalanced " << experts.size() << " expert workers, balance ratio "
            << response->balance_ratio_before() << " -> " << response->balance_ratio_after()
            << std::endl;
  GetPlacement(nullptr, nullptr, response->mutable_placement());
  if (rebalances_ok_ != nullptr) {
    rebalances_ok_->Increment();
    rebalance_seconds_->Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return out;
}

bool Membership::AttentionWorkersFollow(int64_t version,
                                        std::chrono::steady_clock::time_point deadline) {
  while (true) {
    bool all = true;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, e] : workers_) {
        const bool attention =
            e.info.kind == v1::WORKER_KIND_PREFILL || e.info.kind == v1::WORKER_KIND_DECODE;
        if (attention && e.placement_version < version) all = false;
      }
    }
    if (all) return true;
    if (std::chrono::steady_clock::now() >= deadline || stop_.HasBeenNotified()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void Membership::DropColdReplicas(int64_t version,
                                  const std::map<std::string, std::vector<int>>& hosted,
                                  const std::vector<WorkerInfo>& experts,
                                  const std::vector<std::vector<int>>& planned) {
  bool any = false;
  for (size_t w = 0; w < experts.size(); ++w) {
    auto it = hosted.find(experts[w].id);
    any = any || (it != hosted.end() && it->second.size() > planned[w].size());
  }
  if (!any) return;
  // A few heartbeats: each attention worker fetches the map on its next one
  // and reports it on the one after.
  const auto deadline =
      std::chrono::steady_clock::now() + std::max(std::chrono::milliseconds(10000), 8 * interval_);
  if (!AttentionWorkersFollow(version, deadline)) {
    std::cerr << "router: kept the cold expert replicas: not every attention worker follows "
                 "placement version "
              << version << " yet" << std::endl;
    return;
  }
  int dropped = 0;
  for (size_t w = 0; w < experts.size(); ++w) {
    auto it = hosted.find(experts[w].id);
    if (it == hosted.end() || it->second.size() <= planned[w].size()) continue;
    v1::LoadExpertsRequest req;
    req.mutable_expert_ids()->Add(planned[w].begin(), planned[w].end());
    req.set_exact(true);
    v1::LoadExpertsResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto stub = v1::ExpertWorker::NewStub(
        grpc::CreateChannel(experts[w].address, grpc::InsecureChannelCredentials()));
    const grpc::Status s = stub->LoadExperts(&ctx, req, &resp);
    if (!s.ok()) {
      std::cerr << "router: " << experts[w].id << " kept its cold replicas (" << s.error_message()
                << ")" << std::endl;
      continue;
    }
    dropped += static_cast<int>(it->second.size()) - resp.expert_ids_size();
  }
  std::cerr << "router: dropped " << dropped << " cold expert replicas (placement version "
            << version << ")" << std::endl;
  if (replicas_dropped_ != nullptr && dropped > 0) replicas_dropped_->Increment(dropped);
}

grpc::Status Membership::GetPlacement(grpc::ServerContext*, const v1::GetPlacementRequest*,
                                      v1::PlacementMap* response) {
  absl::MutexLock lock(&mu_);
  response->set_version(placement_version_);
  for (const auto& [id, e] : workers_) {
    if (e.info.kind != v1::WORKER_KIND_EXPERT) continue;
    v1::PlacementMap::Worker* w = response->add_workers();
    w->set_data_plane_address(e.info.data_plane_address);
    w->mutable_expert_ids()->Add(e.info.expert_ids.begin(), e.info.expert_ids.end());
  }
  return grpc::Status::OK;
}

std::vector<WorkerInfo> Membership::Live(v1::WorkerKind kind) const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerInfo> out;
  for (const auto& [id, e] : workers_) {
    if (e.info.kind == kind) out.push_back(e.info);
  }
  return out;
}

void Membership::OnChange(std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  on_change_.push_back(std::move(callback));
}

int64_t Membership::Track(const std::string& worker_id, std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  const int64_t h = ++next_id_;
  tracked_[h] = {worker_id, std::move(cancel)};
  return h;
}

void Membership::Untrack(int64_t handle) {
  absl::MutexLock lock(&mu_);
  tracked_.erase(handle);
}

bool Membership::IsLive(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  return workers_.count(worker_id) > 0;
}

}  // namespace moesh
