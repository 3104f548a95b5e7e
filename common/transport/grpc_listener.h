// The gRPC server a device transport listens on of its own (nccl, cuda_ipc:
// the streams that open their channels, and cuda_ipc's host calls). It stops
// when destroyed, giving calls a second to end: declared as its owner's last
// member, it goes first, while what its handlers use is still there.
#ifndef MOESH_COMMON_TRANSPORT_GRPC_LISTENER_H_
#define MOESH_COMMON_TRANSPORT_GRPC_LISTENER_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "common/rpc/grpc_util.h"
#include "grpcpp/server.h"

namespace moesh {

class GrpcListener {
 public:
  ~GrpcListener() {
    if (server_.server != nullptr) {
      server_.server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    }
  }

  // Serves `services` (borrowed) on `listen` (StartGrpcServer).
  absl::Status Start(const std::string& listen, const std::vector<grpc::Service*>& services) {
    ASSIGN_OR_RETURN(server_, StartGrpcServer(listen, services));
    return absl::OkStatus();
  }
  int port() const { return server_.port; }

 private:
  RunningServer server_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_GRPC_LISTENER_H_
