#include "common/transport/transport_registry.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace moesh {
namespace {

const std::vector<const TransportPlugin*>& Plugins() {
  static const std::vector<const TransportPlugin*> plugins = {
      &GrpcTransportPlugin(), &InprocTransportPlugin(), &UcxTransportPlugin(),
      &NcclTransportPlugin(), &CudaIpcTransportPlugin()};
  return plugins;
}

}  // namespace

DataPlaneEndpoint ListenerEndpoint(const std::string& host,
                                   std::unique_ptr<DataPlaneServer> server) {
  DataPlaneEndpoint e;
  e.address = absl::StrCat(host, ":", server->port());
  e.server = std::move(server);
  return e;
}

DataPlaneEndpoint GrpcEndpoint(const DataPlaneServeOptions& options) {
  DataPlaneEndpoint e;
  e.address = options.grpc_address;
  return e;
}

absl::StatusOr<const TransportPlugin*> FindTransport(absl::string_view name) {
  for (const TransportPlugin* p : Plugins()) {
    if (p->name() == name) return p;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown transport \"", name, "\" (",
                                                 absl::StrJoin(TransportNames(), ", "), ")"));
}

std::vector<std::string> TransportNames() {
  std::vector<std::string> names;
  for (const TransportPlugin* p : Plugins()) names.emplace_back(p->name());
  return names;
}

absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(absl::string_view name, int cuda_device) {
  ASSIGN_OR_RETURN(const TransportPlugin* plugin, FindTransport(name));
  return plugin->Connect(cuda_device);
}

}  // namespace moesh
