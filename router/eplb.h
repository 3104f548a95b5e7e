// Expert-parallel load balancing (DeepSeek's EPLB idea): given how many
// tokens each logical expert received, decide how many replicas each gets and
// on which worker each replica lives, so the hottest experts are replicated
// and every worker carries about the same load.
//
// Pure functions; the router feeds them the per-expert load its expert
// workers report and turns the plan into a new placement map version.
#ifndef MOESH_ROUTER_EPLB_H_
#define MOESH_ROUTER_EPLB_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace moesh {

struct EplbPlan {
  std::vector<std::vector<int>> worker_experts;  // [num_workers] -> experts hosted (sorted)
  std::vector<int> replicas;                     // [num_experts] -> replica count (>= 1)
  std::vector<double> worker_load;               // [num_workers] expected tokens
  // max / mean of worker_load; 1 is perfect.
  double balance_ratio = 0;
};

// REQUIRES nothing; INVALID_ARGUMENT unless num_workers >= 1, slots >= 1,
// num_workers * slots >= number of experts, and loads are non-negative.
// Every expert gets at least one replica, no worker holds more than
// `slots_per_worker` experts or the same expert twice, and a replica's share
// of its expert's load is load / replicas (traffic spread evenly over them).
absl::StatusOr<EplbPlan> PlanExpertPlacement(const std::vector<double>& expert_load,
                                             int num_workers, int slots_per_worker);

// The balance ratio of contiguous sharding (worker w hosts experts
// [w*E/W, (w+1)*E/W)), the placement without EPLB, for comparison.
double ContiguousBalanceRatio(const std::vector<double>& expert_load, int num_workers);

}  // namespace moesh

#endif  // MOESH_ROUTER_EPLB_H_
