#include "common/transport/data_plane_endpoint.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace moesh {

absl::StatusOr<DataPlaneEndpoint> StartDataPlane(const std::string& transport,
                                                 const std::string& host,
                                                 const std::string& grpc_address,
                                                 DispatchHandler* dispatch, KvHandler* kv,
                                                 int cuda_device,
                                                 DeviceDispatchHandler* device_dispatch) {
  ASSIGN_OR_RETURN(const TransportPlugin* plugin, FindTransport(transport));
  absl::StatusOr<DataPlaneEndpoint> e =
      plugin->Serve({host, grpc_address, dispatch, kv, device_dispatch, cuda_device});
  if (!e.ok() && e.status().code() == absl::StatusCode::kUnimplemented) {
    return absl::InvalidArgumentError(
        absl::StrCat("--transport \"", transport, "\" has no server side: ", e.status().message()));
  }
  return e;
}

}  // namespace moesh
