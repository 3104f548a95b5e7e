// grpc: the DataPlane service over gRPC channels.
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"
#include "common/transport/dispatch_wire.h"
#include "common/transport/kv_wire.h"
#include "common/transport/transport.h"
#include "common/transport/transport_registry.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {
namespace {

constexpr int kDataPlaneDeadlineSeconds = 30;

class GrpcChannel : public DataChannel {
 public:
  // Dispatch and KV messages can be large (KV of a long prompt): the internal
  // plane's limit, the receiver's --max_receive_message_mb, bounds them.
  explicit GrpcChannel(std::string address)
      : address_(std::move(address)),
        stub_(v1::DataPlane::NewStub(CreateInternalChannel(address_))) {}
  absl::Status Dispatch(const MoeDispatch& dispatch, float* out) override {
    RETURN_IF_ERROR(CheckHostDispatch(dispatch, address_));
    v1::DispatchRequest request;
    EncodeDispatchRequest(dispatch, &request);
    v1::DispatchResponse response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(kDataPlaneDeadlineSeconds));
    RETURN_IF_ERROR(Annotate(FromGrpcStatus(stub_->Dispatch(&ctx, request, &response))));
    return DecodeDispatchResponse(response, dispatch, address_, out);
  }
  absl::Status PushKv(const KvTransfer& transfer) override {
    v1::PushKvRequest request;
    EncodePushKv(transfer, &request);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(kDataPlaneDeadlineSeconds));
    v1::PushKvResponse response;
    return Annotate(FromGrpcStatus(stub_->PushKv(&ctx, request, &response)));
  }
  const std::string& peer() const override { return address_; }

 private:
  absl::Status Annotate(absl::Status s) const {
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat("data plane to ", address_, ": ", s.message()));
  }
  const std::string address_;
  std::unique_ptr<v1::DataPlane::Stub> stub_;
};

}  // namespace

// Channels that move device memory override these.
absl::Status DataChannel::Post(const MoeDispatch& dispatch) {
  return absl::UnimplementedError(absl::StrCat("data plane to ", peer(),
                                               ": this transport moves no device memory (a ",
                                               dispatch.memory.ToString(), " dispatch)"));
}
absl::Status DataChannel::Collect(float*, bool) {
  return absl::UnimplementedError(
      absl::StrCat("data plane to ", peer(), ": this transport moves no device memory"));
}

absl::Status CheckHostDispatch(const MoeDispatch& dispatch, const std::string& peer) {
  if (dispatch.memory.is_host()) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat("data plane to ", peer, ": Dispatch takes host ",
                                               "memory, not ", dispatch.memory.ToString(),
                                               " (posted dispatches: Post, Collect)"));
}

std::unique_ptr<Transport> MakeGrpcTransport() {
  return std::make_unique<ChannelTransport<GrpcChannel>>("grpc");
}
std::unique_ptr<Transport> MakeInprocTransport();

// Rides on the worker's gRPC server (the DataPlane service it serves anyway).
const TransportPlugin& GrpcTransportPlugin() {
  static const BasicTransportPlugin plugin(
      "grpc", {},
      [](int) -> absl::StatusOr<std::unique_ptr<Transport>> { return MakeGrpcTransport(); },
      [](const DataPlaneServeOptions& o) -> absl::StatusOr<DataPlaneEndpoint> {
        return GrpcEndpoint(o);
      });
  return plugin;
}

}  // namespace moesh
