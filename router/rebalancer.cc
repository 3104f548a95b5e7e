#include "router/rebalancer.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <iostream>
#include <numeric>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/rpc/internal_plane.h"
#include "moesh/v1/worker.grpc.pb.h"
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

Rebalancer::Rebalancer(WorkerRegistry* registry, RebalancePolicy policy, Metrics* metrics)
    : registry_(registry), policy_(policy) {
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
  if (policy_.interval.count() > 0) thread_ = std::thread([this] { AutoRebalance(); });
}

Rebalancer::~Rebalancer() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

std::vector<double> Rebalancer::LoadSinceBaseline(const std::vector<double>& total) const {
  absl::MutexLock lock(&mu_);
  std::vector<double> since = total;
  for (size_t e = 0; e < since.size() && e < load_baseline_.size(); ++e) {
    if (total[e] >= load_baseline_[e]) since[e] -= load_baseline_[e];
  }
  return since;
}

double Rebalancer::ExpertBalanceRatio() const {
  const std::vector<WorkerInfo> experts = registry_->Live(v1::WORKER_KIND_EXPERT);
  ExpertLoad tally = Tally(experts);
  tally.load = LoadSinceBaseline(tally.load);
  return BalanceRatio(experts, tally);
}

void Rebalancer::AutoRebalance() {
  while (!stop_.WaitForNotificationWithTimeout(absl::FromChrono(policy_.interval))) {
    const double ratio = ExpertBalanceRatio();
    if (balance_ratio_ != nullptr) balance_ratio_->Set(ratio);
    if (ratio <= policy_.min_ratio) continue;
    if (!registry_->IsPlacementWriter()) continue;  // router HA: the writer rebalances
    absl::StatusOr<RebalanceResult> r = Run(policy_.slots_per_worker);
    if (!r.ok()) std::cerr << "router: automatic rebalance failed: " << r.status() << std::endl;
  }
}

absl::StatusOr<RebalanceResult> Rebalancer::Run(int slots_per_worker) {
  absl::MutexLock serial(&run_mu_);
  const auto start = std::chrono::steady_clock::now();
  RebalanceResult out;
  auto failed = [&](absl::Status s) {
    if (rebalances_failed_ != nullptr) rebalances_failed_->Increment();
    return s;
  };
  if (!registry_->IsPlacementWriter()) {
    return failed(absl::FailedPreconditionError(
        "this router is not the placement writer: the attention workers route by another "
        "router's map (the lowest-addressed router they reach); rebalance there"));
  }
  std::vector<WorkerInfo> experts = registry_->Live(v1::WORKER_KIND_EXPERT);
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
  out.balance_ratio_before = BalanceRatio(experts, tally);
  out.balance_ratio_after = plan->balance_ratio;
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
    auto stub = v1::ExpertWorker::NewStub(CreateInternalChannel(experts[w].address));
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
  std::map<std::string, std::vector<int>> planned;
  for (size_t w = 0; w < experts.size(); ++w) planned[experts[w].id] = plan->worker_experts[w];
  const int64_t version = registry_->SetPlacement(planned);
  out.placement_version = version;
  {
    absl::MutexLock lock(&mu_);
    load_baseline_ = totals;
  }
  DropColdReplicas(version, hosted, experts, plan->worker_experts);
  std::cerr << "router: rebalanced " << experts.size() << " expert workers, balance ratio "
            << out.balance_ratio_before << " -> " << out.balance_ratio_after << std::endl;
  out.placement = registry_->Placement();
  if (rebalances_ok_ != nullptr) {
    rebalances_ok_->Increment();
    rebalance_seconds_->Observe(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return out;
}

bool Rebalancer::WaitForAttentionWorkers(int64_t version,
                                         std::chrono::steady_clock::time_point deadline) {
  while (!registry_->AttentionWorkersFollow(version)) {
    if (std::chrono::steady_clock::now() >= deadline || stop_.HasBeenNotified()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void Rebalancer::DropColdReplicas(int64_t version,
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
      std::chrono::steady_clock::now() +
      std::max(std::chrono::milliseconds(10000), 8 * registry_->heartbeat_interval());
  if (!WaitForAttentionWorkers(version, deadline)) {
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
    auto stub = v1::ExpertWorker::NewStub(CreateInternalChannel(experts[w].address));
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

}  // namespace moesh
