#include "router/membership.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <iostream>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "router/eplb.h"

namespace moesh {

Membership::Membership(std::string model_fingerprint, std::chrono::milliseconds heartbeat_interval,
                       std::chrono::milliseconds timeout)
    : fingerprint_(std::move(model_fingerprint)), interval_(heartbeat_interval), timeout_(timeout) {
  sweeper_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(absl::FromChrono(interval_))) Sweep();
  });
}

Membership::~Membership() {
  stop_.Notify();
  sweeper_.join();
}

grpc::Status Membership::Register(grpc::ServerContext*, const v1::RegisterRequest* request,
                                  v1::RegisterResponse* response) {
  if (request->model_fingerprint() != fingerprint_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("worker serves ", request->model_fingerprint(), ", router ", fingerprint_));
  }
  if (request->kind() == v1::WORKER_KIND_UNSPECIFIED || request->address().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "registration needs a kind and an address");
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
  absl::MutexLock serial(&rebalance_mu_);
  std::vector<WorkerInfo> experts = Live(v1::WORKER_KIND_EXPERT);
  if (experts.empty()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no expert workers are registered");
  // Load per expert = what every worker reported serving for it.
  int num_experts = 0;
  for (const WorkerInfo& w : experts) {
    num_experts = std::max(num_experts, w.load.expert_tokens_size());
    for (int e : w.expert_ids) num_experts = std::max(num_experts, e + 1);
  }
  std::vector<double> load(num_experts, 0.0);
  std::vector<int> replicas(num_experts, 0);
  size_t most = 0;
  for (const WorkerInfo& w : experts) {
    for (int e = 0; e < w.load.expert_tokens_size(); ++e) load[e] += static_cast<double>(w.load.expert_tokens(e));
    for (int e : w.expert_ids) ++replicas[e];
    most = std::max(most, w.expert_ids.size());
  }
  const int slots = std::max<int>(request->slots_per_worker(), static_cast<int>(most));
  absl::StatusOr<EplbPlan> plan = PlanExpertPlacement(load, static_cast<int>(experts.size()), slots);
  if (!plan.ok()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(plan.status().message()));
  std::vector<double> before(experts.size(), 0.0);
  for (size_t w = 0; w < experts.size(); ++w) {
    for (int e : experts[w].expert_ids) before[w] += load[e] / std::max(replicas[e], 1);
  }
  const double total = std::accumulate(before.begin(), before.end(), 0.0);
  response->set_balance_ratio_before(
      total > 0 ? *std::max_element(before.begin(), before.end()) / (total / before.size()) : 1.0);
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
    auto stub = v1::ExpertWorker::NewStub(grpc::CreateChannel(experts[w].address, grpc::InsecureChannelCredentials()));
    grpc::Status s = stub->LoadExperts(&ctx, req, &resp);
    if (!s.ok()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, absl::StrCat(experts[w].id, " could not load its new experts (",
                                                                      s.error_message(), "); the map is unchanged"));
    }
    hosted[experts[w].id].assign(resp.expert_ids().begin(), resp.expert_ids().end());
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, ids] : hosted) {
      auto it = workers_.find(id);
      if (it != workers_.end()) it->second.info.expert_ids = ids;
    }
    ++placement_version_;
    response->set_placement_version(placement_version_);
  }
  std::cerr << "router: rebalanced " << experts.size() << " expert workers, balance ratio "
            << response->balance_ratio_before() << " -> " << response->balance_ratio_after() << std::endl;
  return GetPlacement(nullptr, nullptr, response->mutable_placement());
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
