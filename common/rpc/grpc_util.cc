#include "common/rpc/grpc_util.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/rpc/internal_plane.h"

namespace moesh {
namespace {
constexpr int kMaxMessageBytes = 1 << 30;
}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl and gRPC share code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

absl::StatusOr<RunningServer> StartGrpcServer(
    const std::string& address, const std::vector<grpc::Service*>& services,
    int max_receive_message_mb, std::shared_ptr<grpc::ServerCredentials> credentials) {
  if (max_receive_message_mb < 1 || max_receive_message_mb > kMaxReceiveMessageMbLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("the largest message to receive must lie in [1, ", kMaxReceiveMessageMbLimit,
                     "] MiB, got ", max_receive_message_mb));
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  RunningServer out;
  builder.AddListeningPort(
      address, credentials != nullptr ? std::move(credentials) : InternalServerCredentials(),
      &out.port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(max_receive_message_mb << 20);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  for (grpc::Service* s : services) builder.RegisterService(s);
  out.server = builder.BuildAndStart();
  if (out.server == nullptr || out.port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  out.server->GetHealthCheckService()->SetServingStatus(true);
  return out;
}

std::string PeerHost(const grpc::ServerContextBase& context) {
  const std::string peer = context.peer();
  const size_t colon = peer.rfind(':');
  // A port follows the last colon of "ipv4:h:p" and "ipv6:[h]:p" (not of "unix:/path").
  const size_t scheme = peer.find(':');
  if (colon == std::string::npos || colon == scheme) return peer;
  return peer.substr(0, colon);
}

}  // namespace moesh
