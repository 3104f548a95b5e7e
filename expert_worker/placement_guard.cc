#include "expert_worker/placement_guard.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"
#include "common/service/router_links.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

absl::Status CheckDropAgainst(const v1::PlacementMap& map, const std::string& self,
                              const std::set<int>& drop) {
  std::set<int> here, elsewhere;
  for (const v1::PlacementMap::Worker& w : map.workers()) {
    std::set<int>& hosts = w.data_plane_address() == self ? here : elsewhere;
    hosts.insert(w.expert_ids().begin(), w.expert_ids().end());
  }
  for (int e : drop) {
    if (here.count(e)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "expert_ids: leaves out expert ", e, ", which placement version ", map.version(),
          " still routes to this worker; an exact load drops only replicas the map no longer "
          "uses"));
    }
    if (!elsewhere.count(e)) {
      return absl::FailedPreconditionError(
          absl::StrCat("expert_ids: leaves out expert ", e,
                       ", which no other worker hosts in "
                       "placement version ",
                       map.version(), "; dropping it would leave it without a host"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDropWithRouter(const std::string& router, const std::string& self,
                                 const std::set<int>& drop) {
  if (drop.empty()) return absl::OkStatus();
  if (router.empty()) {
    return absl::FailedPreconditionError(
        "expert_ids: an exact load would drop hosted experts, but this worker has no --router "
        "whose placement map could show them another host");
  }
  ASSIGN_OR_RETURN(const std::vector<std::string> addresses, ResolveRouters(router));
  // The placement writer's map: the first router (in address order) that answers.
  std::string last;
  for (const std::string& address : addresses) {
    auto stub = v1::Cluster::NewStub(CreateInternalChannel(address));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::PlacementMap map;
    const grpc::Status s = stub->GetPlacement(&ctx, v1::GetPlacementRequest(), &map);
    if (s.ok()) return CheckDropAgainst(map, self, drop);
    last = absl::StrCat(address, ": ", s.error_message());
  }
  return absl::UnavailableError(
      absl::StrCat("the router's placement map to check the drop against: ", last));
}

}  // namespace moesh
