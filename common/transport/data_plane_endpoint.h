// A worker's receiving end of the data plane for its --transport: the
// transport's plugin (transport_registry.h) serves it — grpc rides on the
// worker's gRPC server (the DataPlane service); ucx, nccl and cuda_ipc start a
// listener of their own. The address is what the worker advertises to peers.
#ifndef MOESH_COMMON_TRANSPORT_DATA_PLANE_ENDPOINT_H_
#define MOESH_COMMON_TRANSPORT_DATA_PLANE_ENDPOINT_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/transport/transport.h"
#include "common/transport/transport_registry.h"

namespace moesh {

// `host`: the advertised host; `grpc_address`: the worker's gRPC address.
// Handlers may be null; they must outlive the endpoint. nccl and cuda_ipc
// carry expert dispatch (device-resident ones land on CUDA device
// `cuda_device` and reach `dispatch` in its memory); a KV-only endpoint
// (decode workers) stays on gRPC with them, since prefill and decode may
// share a GPU, which NCCL cannot connect, and the KV handoff is host-side.
absl::StatusOr<DataPlaneEndpoint> StartDataPlane(const std::string& transport,
                                                 const std::string& host,
                                                 const std::string& grpc_address,
                                                 DispatchHandler* dispatch, KvHandler* kv,
                                                 int cuda_device = 0);

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_DATA_PLANE_ENDPOINT_H_
