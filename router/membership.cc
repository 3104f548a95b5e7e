#include "router/membership.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

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
