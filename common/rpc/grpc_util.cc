#include "common/rpc/grpc_util.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"

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

absl::StatusOr<RunningServer> StartGrpcServer(const std::string& address,
                                              const std::vector<grpc::Service*>& services,
                                              int max_receive_message_mb) {
  if (max_receive_message_mb < 1 || max_receive_message_mb > kMaxReceiveMessageMbLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("the largest message to receive must lie in [1, ", kMaxReceiveMessageMbLimit,
                     "] MiB, got ", max_receive_message_mb));
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  RunningServer out;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &out.port);
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

grpc::ChannelArguments InternalChannelArgs() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  return args;
}

}  // namespace moesh
