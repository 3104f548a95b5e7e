#include "common/transport/data_plane_endpoint.h"

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace moesh {

absl::StatusOr<DataPlaneEndpoint> StartDataPlane(const std::string& transport,
                                                 const std::string& host,
                                                 const std::string& grpc_address,
                                                 DispatchHandler* dispatch, KvHandler* kv,
                                                 int cuda_device,
                                                 DeviceDispatchHandler* device_dispatch) {
  ASSIGN_OR_RETURN(const TransportPlugin* plugin, FindTransport(transport));
  DataPlaneServeOptions o;
  o.host = host;
  o.grpc_address = grpc_address;
  o.dispatch = dispatch;
  o.kv = kv;
  o.device_dispatch = device_dispatch;
  o.cuda_device = cuda_device;
  absl::StatusOr<DataPlaneEndpoint> e = plugin->Serve(o);
  if (!e.ok() && e.status().code() == absl::StatusCode::kUnimplemented) {
    return absl::InvalidArgumentError(
        absl::StrCat("--transport \"", transport, "\" has no server side: ", e.status().message()));
  }
  return e;
}

}  // namespace moesh
