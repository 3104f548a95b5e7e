#include "common/transport/data_plane_endpoint.h"

#include "base/status.h"

namespace moesh {

absl::StatusOr<DataPlaneEndpoint> StartDataPlane(const std::string& transport,
                                                 const std::string& host,
                                                 const std::string& grpc_address,
                                                 DispatchHandler* dispatch, KvHandler* kv,
                                                 int cuda_device) {
  ASSIGN_OR_RETURN(const TransportPlugin* plugin, FindTransport(transport));
  return plugin->Serve({host, grpc_address, dispatch, kv, cuda_device});
}

}  // namespace moesh
