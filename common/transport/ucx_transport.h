// The ucx transport: DataPlane calls as UCX active messages. A request goes
// out as one AM (header: call id + method; payload: the serialized proto)
// with UCP_AM_SEND_FLAG_REPLY; the server answers on the reply endpoint.
// Large payloads travel by UCX rendezvous (zero-copy on capable transports).
// Loopback here: UCX_NET_DEVICES=lo and UCX_TLS=tcp (or shm with tcp for the
// connection); RDMA on real clusters. Addresses ("host:port" of the server's
// UCX listener) are exchanged over gRPC (registration / ExpertWorker.Info).
#ifndef MOESH_COMMON_TRANSPORT_UCX_TRANSPORT_H_
#define MOESH_COMMON_TRANSPORT_UCX_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/transport/transport.h"

namespace moesh {

std::unique_ptr<Transport> MakeUcxTransport();

// The receiving side: a UCX listener dispatching to a service's handlers
// (either may be null: UNIMPLEMENTED). Thread-safe; handlers run on a pool
// of threads and must outlive the server.
class UcxDataPlaneServer : public DataPlaneServer {
 public:
  // `listen`: "host:port", port 0 picks a free one.
  static absl::StatusOr<std::unique_ptr<UcxDataPlaneServer>> Start(const std::string& listen,
                                                                   DispatchHandler* dispatch,
                                                                   KvHandler* kv);
};

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_UCX_TRANSPORT_H_
