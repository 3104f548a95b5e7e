#include "common/transport/data_plane_endpoint.h"

#include "absl/strings/str_cat.h"

namespace moesh {

absl::StatusOr<DataPlaneEndpoint> StartDataPlane(const std::string& transport,
                                                 const std::string& host,
                                                 const std::string& grpc_address,
                                                 DispatchHandler* dispatch, KvHandler* kv,
                                                 int cuda_device,
                                                 DeviceDispatchHandler* device_dispatch) {
  DataPlaneEndpoint e;
  if (transport == "grpc") {
    e.address = grpc_address;
    return e;
  }
  if (transport == "ucx") {
    absl::StatusOr<std::unique_ptr<UcxDataPlaneServer>> s =
        UcxDataPlaneServer::Start(host + ":0", dispatch, kv);
    if (!s.ok()) return s.status();
    e.ucx = std::move(*s);
    e.address = absl::StrCat(host, ":", e.ucx->port());
    return e;
  }
  if (transport == "nccl") {
    if (dispatch == nullptr && device_dispatch == nullptr) {
      e.address = grpc_address;
      return e;
    }
    absl::StatusOr<std::unique_ptr<NcclDataPlaneServer>> s =
        NcclDataPlaneServer::Start(host + ":0", cuda_device, dispatch, kv, device_dispatch);
    if (!s.ok()) return s.status();
    e.nccl = std::move(*s);
    e.address = absl::StrCat(host, ":", e.nccl->port());
    return e;
  }
  if (transport == "cuda_ipc") {
    if (dispatch == nullptr && device_dispatch == nullptr) {
      e.address = grpc_address;
      return e;
    }
    absl::StatusOr<std::unique_ptr<CudaIpcDataPlaneServer>> s =
        CudaIpcDataPlaneServer::Start(host + ":0", cuda_device, dispatch, device_dispatch, kv);
    if (!s.ok()) return s.status();
    e.ipc = std::move(*s);
    e.address = absl::StrCat(host, ":", e.ipc->port());
    return e;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--transport \"", transport, "\" has no server side here (grpc, ucx, nccl, cuda_ipc)"));
}

}  // namespace moesh
