#include "router/worker_registry.h"

#include <algorithm>
#include <iostream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "base/random_id.h"

namespace moesh {

WorkerRegistry::WorkerRegistry(std::string model_fingerprint,
                               std::chrono::milliseconds heartbeat_interval,
                               std::chrono::milliseconds timeout)
    : fingerprint_(std::move(model_fingerprint)), interval_(heartbeat_interval), timeout_(timeout) {
  sweeper_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(absl::FromChrono(interval_))) Sweep();
  });
}

WorkerRegistry::~WorkerRegistry() {
  stop_.Notify();
  sweeper_.join();
}

absl::StatusOr<std::string> WorkerRegistry::Register(const WorkerRegistration& r) {
  if (r.model_fingerprint != fingerprint_) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker serves ", r.model_fingerprint, ", router ", fingerprint_));
  }
  if (!v1::WorkerKind_IsValid(r.kind) || r.kind == v1::WORKER_KIND_UNSPECIFIED ||
      r.address.empty()) {
    return absl::InvalidArgumentError("registration needs a kind and an address");
  }
  // 128 bits: a worker id nobody can guess, so no peer can aim
  // Cluster.Deregister or heartbeats at another.
  absl::StatusOr<std::string> suffix = RandomHexId(16);
  if (!suffix.ok()) return suffix.status();
  std::vector<std::function<void()>> notify;
  std::string id;
  {
    absl::MutexLock lock(&mu_);
    // A worker re-registering from the same address replaces its old self.
    for (auto it = workers_.begin(); it != workers_.end(); ++it) {
      if (it->second.info.address == r.address) {
        Drop(it->first);
        break;
      }
    }
    Entry e;
    e.info.id = absl::StrCat(v1::WorkerKind_Name(r.kind).substr(12), "-", *suffix);
    e.info.kind = r.kind;
    e.info.address = r.address;
    e.info.data_plane_address = r.data_plane_address.empty() ? r.address : r.data_plane_address;
    e.info.computes_prompts = r.computes_prompts;
    e.info.expert_ids = r.expert_ids;
    e.hosted = r.expert_ids;
    e.last_seen = std::chrono::steady_clock::now();
    id = e.info.id;
    std::cerr << "router: " << e.info.id << " joined at " << e.info.address << std::endl;
    if (e.info.kind == v1::WORKER_KIND_EXPERT) ++placement_version_;
    workers_[e.info.id] = std::move(e);
    notify = on_change_;
  }
  for (auto& f : notify) f();
  return id;
}

WorkerRegistry::HeartbeatAnswer WorkerRegistry::Heartbeat(const std::string& worker_id,
                                                          const v1::WorkerLoad& load,
                                                          int64_t placement_version,
                                                          bool elsewhere) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  HeartbeatAnswer answer;
  answer.known = it != workers_.end();
  answer.placement_version = placement_version_;
  if (it != workers_.end()) {
    Entry& e = it->second;
    e.last_seen = std::chrono::steady_clock::now();
    e.info.load = load;
    e.placement_version = placement_version;
    e.elsewhere = elsewhere;
    if (e.info.kind == v1::WORKER_KIND_EXPERT && load.hosted_expert_ids_size() > 0) {
      e.hosted.assign(load.hosted_expert_ids().begin(), load.hosted_expert_ids().end());
      std::sort(e.hosted.begin(), e.hosted.end());
      std::vector<int> routed = Routed(e);
      if (!routed.empty() && routed != e.info.expert_ids) {
        e.info.expert_ids = std::move(routed);
        answer.placement_version = ++placement_version_;
      }
    }
  }
  return answer;
}

std::vector<int> WorkerRegistry::Routed(const Entry& e) {
  if (e.planned.empty()) return e.hosted;
  std::vector<int> routed;
  std::set_intersection(e.planned.begin(), e.planned.end(), e.hosted.begin(), e.hosted.end(),
                        std::back_inserter(routed));
  return routed;
}

void WorkerRegistry::Drop(std::string id) {
  auto it = workers_.find(id);
  if (it == workers_.end()) return;
  std::cerr << "router: dropping " << id << " at " << it->second.info.address << std::endl;
  if (it->second.info.kind == v1::WORKER_KIND_EXPERT) ++placement_version_;
  workers_.erase(it);
  for (auto& [handle, entry] : tracked_) {
    if (entry.first == id) to_cancel_.push_back(entry.second);
  }
}

void WorkerRegistry::Sweep() {
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

void WorkerRegistry::Deregister(const std::string& worker_id) {
  std::vector<std::function<void()>> notify;
  {
    absl::MutexLock lock(&mu_);
    if (!workers_.count(worker_id)) return;
    std::cerr << "router: " << worker_id << " is leaving" << std::endl;
    Drop(worker_id);
    // Its in-flight calls drain on their own; nothing to cancel.
    to_cancel_.clear();
    notify = on_change_;
  }
  for (auto& f : notify) f();
}

PlacementMap WorkerRegistry::Placement() const {
  absl::MutexLock lock(&mu_);
  PlacementMap map;
  map.version = placement_version_;
  for (const auto& [id, e] : workers_) {
    if (e.info.kind != v1::WORKER_KIND_EXPERT) continue;
    map.workers.push_back({e.info.data_plane_address, e.info.expert_ids});
  }
  return map;
}

int64_t WorkerRegistry::SetPlacement(
    const std::map<std::string, std::vector<int>>& experts_by_worker) {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, experts] : experts_by_worker) {
    auto it = workers_.find(id);
    if (it == workers_.end()) continue;
    it->second.info.expert_ids = experts;
    it->second.planned = experts;
    std::sort(it->second.planned.begin(), it->second.planned.end());
    // The rebalancer loaded them before: they are held (the next heartbeat says so too).
    std::vector<int> held;
    std::set_union(it->second.hosted.begin(), it->second.hosted.end(), it->second.planned.begin(),
                   it->second.planned.end(), std::back_inserter(held));
    it->second.hosted = std::move(held);
  }
  return ++placement_version_;
}

bool WorkerRegistry::IsPlacementWriter() const {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : workers_) {
    const bool attention =
        e.info.kind == v1::WORKER_KIND_PREFILL || e.info.kind == v1::WORKER_KIND_DECODE;
    if (attention && e.elsewhere && !e.info.load.draining()) return false;
  }
  return true;
}

bool WorkerRegistry::AttentionWorkersFollow(int64_t version) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : workers_) {
    const bool attention =
        e.info.kind == v1::WORKER_KIND_PREFILL || e.info.kind == v1::WORKER_KIND_DECODE;
    if (attention && e.placement_version < version) return false;
  }
  return true;
}

std::vector<WorkerInfo> WorkerRegistry::Live(v1::WorkerKind kind) const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerInfo> out;
  for (const auto& [id, e] : workers_) {
    if (e.info.kind == kind && !e.info.load.draining()) out.push_back(e.info);
  }
  return out;
}

void WorkerRegistry::OnChange(std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  on_change_.push_back(std::move(callback));
}

int64_t WorkerRegistry::Track(const std::string& worker_id, std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  const int64_t h = ++next_id_;
  tracked_[h] = {worker_id, std::move(cancel)};
  return h;
}

void WorkerRegistry::Untrack(int64_t handle) {
  absl::MutexLock lock(&mu_);
  tracked_.erase(handle);
}

bool WorkerRegistry::IsLive(const std::string& worker_id) const {
  absl::MutexLock lock(&mu_);
  return workers_.count(worker_id) > 0;
}

}  // namespace moesh
