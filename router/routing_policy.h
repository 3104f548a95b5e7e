// How the router picks a request's prefill worker and orders the decode
// workers it tries (--routing_policy; the picking itself is
// router/cluster_backend.h's PickPrefillWorker and OrderDecodeWorkers).
// Header-only: the router's flags and `moesh serve-local` read the names too.
#ifndef MOESH_ROUTER_ROUTING_POLICY_H_
#define MOESH_ROUTER_ROUTING_POLICY_H_

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace moesh {

enum class RoutingPolicy {
  // "kv_aware" (the default): the load the workers report, and the prompt's
  // prefix their prefix caches hold.
  kKvAware,
  // "load": the load alone: the fewest queued prompt tokens (prefill); the
  // least KV usage, then the fewest running (decode).
  kLoad,
  // "round_robin": the workers in turn, whatever their load or cache (the
  // baseline the other two are measured against).
  kRoundRobin,
};

inline absl::string_view RoutingPolicyName(RoutingPolicy policy) {
  switch (policy) {
    case RoutingPolicy::kKvAware:
      return "kv_aware";
    case RoutingPolicy::kLoad:
      return "load";
    case RoutingPolicy::kRoundRobin:
      return "round_robin";
  }
  return "?";
}

// A --routing_policy value; INVALID_ARGUMENT naming the flag and the
// policies for anything but their three names.
inline absl::StatusOr<RoutingPolicy> ParseRoutingPolicy(absl::string_view name) {
  for (RoutingPolicy p :
       {RoutingPolicy::kKvAware, RoutingPolicy::kLoad, RoutingPolicy::kRoundRobin}) {
    if (name == RoutingPolicyName(p)) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("--routing_policy: unknown policy \"", name,
                                                 "\" (kv_aware, load or round_robin)"));
}

}  // namespace moesh

#endif  // MOESH_ROUTER_ROUTING_POLICY_H_
