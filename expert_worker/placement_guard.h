// The rule that keeps ExpertWorker.LoadExperts{exact} from causing an outage:
// an expert worker drops a hosted expert only when the router's current
// placement map (Cluster.GetPlacement) no longer routes that expert to this
// worker and routes it to at least one other worker. That is what the
// router's rebalancer does (it switches the map first and drops cold replicas
// once every attention worker follows it); a stray or hostile exact load that
// would take away an expert still routed here, or one without another host,
// is refused FAILED_PRECONDITION and nothing is dropped. Without a router
// (static --expert_workers lists) nothing vouches for another host, so no
// expert is dropped at all.
#ifndef MOESH_EXPERT_WORKER_PLACEMENT_GUARD_H_
#define MOESH_EXPERT_WORKER_PLACEMENT_GUARD_H_

#include <set>
#include <string>

#include "absl/status/status.h"
#include "moesh/v1/worker.pb.h"

namespace moesh {

// The rule against a given map: OK iff every expert of `drop` is routed by
// `map` to a worker other than `self` (this worker's data-plane address) and
// not to `self`.
absl::Status CheckDropAgainst(const v1::PlacementMap& map, const std::string& self,
                              const std::set<int>& drop);

// The rule against the current map of `router` (--router: host:port, or a
// list or DNS name naming several routers, whose placement writer's map is
// the first in address order that answers; empty: no router, refused).
// UNAVAILABLE when no router answers.
absl::Status CheckDropWithRouter(const std::string& router, const std::string& self,
                                 const std::set<int>& drop);

}  // namespace moesh

#endif  // MOESH_EXPERT_WORKER_PLACEMENT_GUARD_H_
