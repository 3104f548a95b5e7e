#include "common/transport/nccl_transport.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "common/service/cuda_backends_plugin.h"
#include "common/service/grpc_util.h"
#include "common/status.h"

namespace moesh {
namespace {

using Stream = grpc::ClientReaderWriter<v1::NcclFrame, v1::NcclFrame>;

class NcclChannel : public DataChannel {
 public:
  NcclChannel(std::string peer, std::unique_ptr<v1::NcclDataPlane::Stub> stub,
              std::unique_ptr<grpc::ClientContext> ctx, std::unique_ptr<Stream> stream,
              std::unique_ptr<BytePipe> pipe, absl::Duration call_timeout)
      : peer_(std::move(peer)),
        stub_(std::move(stub)),
        ctx_(std::move(ctx)),
        stream_(std::move(stream)),
        pipe_(std::move(pipe)),
        call_timeout_(call_timeout) {}
  ~NcclChannel() override {
    absl::MutexLock lock(&mu_);
    pipe_->Abort();
    stream_->WritesDone();  // ends the server's side
    ctx_->TryCancel();
    stream_->Finish().IgnoreError();
  }

  absl::Status Dispatch(const v1::DispatchRequest& request, v1::DispatchResponse* response) override {
    v1::DataPlaneCall call;
    *call.mutable_dispatch() = request;
    ASSIGN_OR_RETURN(v1::DataPlaneReply reply, Call(call));
    *response = std::move(*reply.mutable_dispatch());
    return absl::OkStatus();
  }
  absl::Status PushKv(const v1::PushKvRequest& request) override {
    v1::DataPlaneCall call;
    *call.mutable_push_kv() = request;
    return Call(call).status();
  }
  const std::string& peer() const override { return peer_; }

 private:
  absl::StatusOr<v1::DataPlaneReply> Call(const v1::DataPlaneCall& call) {
    absl::MutexLock lock(&mu_);
    if (!broken_.ok()) return broken_;
    const absl::Time deadline = absl::Now() + call_timeout_;
    const std::string bytes = call.SerializeAsString();
    v1::NcclFrame frame;
    frame.set_bytes(bytes.size());
    absl::Status s = stream_->Write(frame) ? absl::OkStatus() : absl::UnavailableError("the stream broke");
    if (s.ok()) s = pipe_->Send(bytes, deadline);
    if (s.ok() && !stream_->Read(&frame)) s = absl::UnavailableError("the stream broke");
    absl::StatusOr<std::string> reply_bytes = s.ok() ? pipe_->Recv(frame.bytes(), deadline) : s;
    v1::DataPlaneReply reply;
    if (reply_bytes.ok() && !reply.ParseFromString(*reply_bytes)) reply_bytes = absl::DataLossError("an unreadable reply");
    if (!reply_bytes.ok()) {
      broken_ = absl::UnavailableError(absl::StrCat("nccl peer ", peer_, ": ", reply_bytes.status().message()));
      pipe_->Abort();
      ctx_->TryCancel();
      return broken_;
    }
    if (reply.code() != 0) return absl::Status(static_cast<absl::StatusCode>(reply.code()), reply.message());
    return reply;
  }

  const std::string peer_;
  absl::Mutex mu_;
  const std::unique_ptr<v1::NcclDataPlane::Stub> stub_;
  const std::unique_ptr<grpc::ClientContext> ctx_;
  const std::unique_ptr<Stream> stream_;
  const std::unique_ptr<BytePipe> pipe_;
  const absl::Duration call_timeout_;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
};

class NcclTransport : public Transport {
 public:
  explicit NcclTransport(const NcclTransportOptions& options) : options_(options) {}
  absl::string_view name() const override { return "nccl"; }

  absl::StatusOr<std::unique_ptr<DataChannel>> Connect(const std::string& address) override {
    ASSIGN_OR_RETURN(const CudaBackendsTable* cuda, CudaBackends());
    ASSIGN_OR_RETURN(std::string id, cuda->new_nccl_id());
    auto stub = v1::NcclDataPlane::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                                                     InternalChannelArgs()));
    auto ctx = std::make_unique<grpc::ClientContext>();
    std::unique_ptr<Stream> stream = stub->Channel(ctx.get());
    v1::NcclFrame hello;
    hello.set_unique_id(id);
    hello.set_client(absl::StrCat("pid ", getpid(), " cuda:", options_.device));
    if (!stream->Write(hello)) {
      const grpc::Status g = stream->Finish();
      return absl::Status(g.ok() ? absl::StatusCode::kUnavailable : static_cast<absl::StatusCode>(g.error_code()),
                          absl::StrCat("nccl peer ", address, ": ", g.error_message()));
    }
    // The server acknowledges the id (or ends the stream saying why not),
    // then joins as rank 1 while we join as rank 0.
    v1::NcclFrame ack;
    if (!stream->Read(&ack)) {
      const grpc::Status g = stream->Finish();
      return absl::Status(g.ok() ? absl::StatusCode::kUnavailable : static_cast<absl::StatusCode>(g.error_code()),
                          absl::StrCat("nccl peer ", address, ": ", g.error_message()));
    }
    absl::StatusOr<std::unique_ptr<BytePipe>> pipe =
        cuda->open_nccl_pipe(id, /*rank=*/0, options_.device, absl::Now() + options_.connect_timeout);
    if (!pipe.ok()) {
      ctx->TryCancel();
      stream->Finish().IgnoreError();
      return absl::UnavailableError(absl::StrCat("nccl peer ", address, " (cuda:", ack.device(), "): ",
                                                 pipe.status().message()));
    }
    return std::unique_ptr<DataChannel>(new NcclChannel(address, std::move(stub), std::move(ctx), std::move(stream),
                                                        std::move(*pipe), options_.call_timeout));
  }

 private:
  const NcclTransportOptions options_;
};

}  // namespace

std::unique_ptr<Transport> MakeNcclTransport(const NcclTransportOptions& options) {
  return std::make_unique<NcclTransport>(options);
}

absl::StatusOr<std::unique_ptr<NcclDataPlaneServer>> NcclDataPlaneServer::Start(const std::string& listen, int device,
                                                                                DispatchHandler* dispatch,
                                                                                KvHandler* kv) {
  RETURN_IF_ERROR(CudaBackends().status());  // no plugin: say so now, not at the first channel
  std::unique_ptr<NcclDataPlaneServer> s(new NcclDataPlaneServer(device, dispatch, kv));
  ASSIGN_OR_RETURN(RunningServer running, StartGrpcServer(listen, {s.get()}));
  s->server_ = std::move(running.server);
  s->port_ = running.port;
  return s;
}

NcclDataPlaneServer::~NcclDataPlaneServer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (BytePipe* p : pipes_) p->Abort();
  }
  // Cancels the streams; their handlers return.
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

grpc::Status NcclDataPlaneServer::Channel(grpc::ServerContext* ctx,
                                          grpc::ServerReaderWriter<v1::NcclFrame, v1::NcclFrame>* stream) {
  v1::NcclFrame frame;
  if (!stream->Read(&frame)) return grpc::Status::OK;
  if (frame.unique_id().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no NCCL unique id");
  absl::StatusOr<const CudaBackendsTable*> cuda = CudaBackends();
  if (!cuda.ok()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, std::string(cuda.status().message()));
  v1::NcclFrame ack;
  ack.set_device(device_);
  if (!stream->Write(ack)) return grpc::Status::OK;
  absl::StatusOr<std::unique_ptr<BytePipe>> pipe =
      (*cuda)->open_nccl_pipe(frame.unique_id(), /*rank=*/1, device_, absl::Now() + absl::Seconds(60));
  if (!pipe.ok()) {
    std::cerr << "nccl data plane: channel from " << frame.client() << " not opened: " << pipe.status() << std::endl;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(pipe.status().message()));
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "shutting down");
    pipes_.push_back(pipe->get());
  }
  bool ok = true;
  while (ok && stream->Read(&frame)) {  // until the client ends the stream
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    absl::StatusOr<std::string> call = (*pipe)->Recv(frame.bytes(), deadline);
    if (!call.ok()) break;
    const std::string reply = Handle(*call);
    v1::NcclFrame out;
    out.set_bytes(reply.size());
    ok = stream->Write(out) && (*pipe)->Send(reply, deadline).ok();
  }
  absl::MutexLock lock(&mu_);
  pipes_.erase(std::find(pipes_.begin(), pipes_.end(), pipe->get()));
  return grpc::Status::OK;
}

std::string NcclDataPlaneServer::Handle(const std::string& bytes) {
  v1::DataPlaneCall call;
  v1::DataPlaneReply reply;
  absl::Status s;
  if (!call.ParseFromString(bytes)) {
    s = absl::InvalidArgumentError("an unreadable DataPlaneCall");
  } else if (call.has_dispatch()) {
    s = dispatch_ != nullptr ? dispatch_->Dispatch(call.dispatch(), reply.mutable_dispatch())
                             : absl::UnimplementedError("this worker takes no expert dispatch");
  } else if (call.has_push_kv()) {
    s = kv_ != nullptr ? kv_->PushKv(call.push_kv()) : absl::UnimplementedError("this worker takes no KV");
  } else {
    s = absl::InvalidArgumentError("an empty DataPlaneCall");
  }
  if (!s.ok()) {
    reply.Clear();
    reply.set_code(static_cast<int>(s.code()));
    reply.set_message(std::string(s.message()));
  }
  return reply.SerializeAsString();
}

}  // namespace moesh
