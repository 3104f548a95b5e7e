#include "expert_worker/placement_guard.h"

#include <grpcpp/grpcpp.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"
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
  auto stub = v1::Cluster::NewStub(CreateInternalChannel(router));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::PlacementMap map;
  const grpc::Status s = stub->GetPlacement(&ctx, v1::GetPlacementRequest(), &map);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat("the router's placement map (", router,
                                               ") to check the drop against: ", s.error_message()));
  }
  return CheckDropAgainst(map, self, drop);
}

}  // namespace moesh
