#include "router/eplb.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace moesh {
namespace {

double Ratio(const std::vector<double>& load) {
  const double total = std::accumulate(load.begin(), load.end(), 0.0);
  if (total <= 0) return 1.0;
  return *std::max_element(load.begin(), load.end()) / (total / load.size());
}

}  // namespace

absl::StatusOr<EplbPlan> PlanExpertPlacement(const std::vector<double>& load, int num_workers,
                                             int slots_per_worker) {
  const int e_count = static_cast<int>(load.size());
  if (num_workers < 1 || slots_per_worker < 1) {
    return absl::InvalidArgumentError("EPLB needs at least one worker with at least one slot");
  }
  if (static_cast<int64_t>(num_workers) * slots_per_worker < e_count) {
    return absl::InvalidArgumentError(absl::StrCat(num_workers, " workers x ", slots_per_worker,
                                                   " slots cannot hold ", e_count, " experts"));
  }
  for (double l : load) {
    if (!(l >= 0)) return absl::InvalidArgumentError("expert loads must be non-negative");
  }
  EplbPlan plan;
  plan.replicas.assign(e_count, 1);
  // 1. Replicate: every free slot goes to the expert with the largest load per
  // replica (no expert gets more replicas than there are workers).
  int64_t free = static_cast<int64_t>(num_workers) * slots_per_worker - e_count;
  while (free-- > 0) {
    int best = -1;
    for (int e = 0; e < e_count; ++e) {
      if (plan.replicas[e] >= num_workers) continue;
      if (best < 0 || load[e] / plan.replicas[e] > load[best] / plan.replicas[best]) best = e;
    }
    if (best < 0) break;  // every expert on every worker already
    // Spare slots go to replicas even of idle experts: more hosts, better failover.
    ++plan.replicas[best];
  }
  // 2. Pack: heaviest replica first onto the least-loaded worker that has a
  // free slot and does not host that expert yet.
  std::vector<std::pair<double, int>> items;  // (share, expert)
  for (int e = 0; e < e_count; ++e) {
    for (int r = 0; r < plan.replicas[e]; ++r) items.push_back({load[e] / plan.replicas[e], e});
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  plan.worker_experts.assign(num_workers, {});
  plan.worker_load.assign(num_workers, 0.0);
  for (const auto& [share, e] : items) {
    int best = -1;
    for (int w = 0; w < num_workers; ++w) {
      const auto& hosted = plan.worker_experts[w];
      if (static_cast<int>(hosted.size()) >= slots_per_worker) continue;
      if (std::find(hosted.begin(), hosted.end(), e) != hosted.end()) continue;
      if (best < 0 || plan.worker_load[w] < plan.worker_load[best] ||
          (plan.worker_load[w] == plan.worker_load[best] &&
           hosted.size() < plan.worker_experts[best].size())) {
        best = w;
      }
    }
    if (best < 0) {
      // Only replicas can be left without a place (every worker already has
      // this expert or is full): drop the extra replica.
      --plan.replicas[e];
      continue;
    }
    plan.worker_experts[best].push_back(e);
    plan.worker_load[best] += share;
  }
  // Shares changed where replicas were dropped; recompute the loads.
  std::fill(plan.worker_load.begin(), plan.worker_load.end(), 0.0);
  for (int w = 0; w < num_workers; ++w) {
    std::sort(plan.worker_experts[w].begin(), plan.worker_experts[w].end());
    for (int e : plan.worker_experts[w]) plan.worker_load[w] += load[e] / plan.replicas[e];
  }
  plan.balance_ratio = Ratio(plan.worker_load);
  return plan;
}

double ContiguousBalanceRatio(const std::vector<double>& load, int num_workers) {
  const int e_count = static_cast<int>(load.size());
  std::vector<double> w_load(num_workers, 0.0);
  for (int w = 0; w < num_workers; ++w) {
    for (int e = w * e_count / num_workers; e < (w + 1) * e_count / num_workers; ++e)
      w_load[w] += load[e];
  }
  return Ratio(w_load);
}

}  // namespace moesh
