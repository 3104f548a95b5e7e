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

class NcclChannel : public DataChannel {
 public:
  NcclChannel(std::string peer, std::unique_ptr<BytePipe> pipe, absl::Duration call_timeout)
      : peer_(std::move(peer)), pipe_(std::move(pipe)), call_timeout_(call_timeout) {}
  ~NcclChannel() override {
    absl::MutexLock lock(&mu_);
    // An empty message closes the server's side; then ours goes.
    if (broken_.ok()) pipe_->Send(std::string(), absl::Now() + absl::Seconds(2)).IgnoreError();
    pipe_->Abort();
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
    absl::Status s = pipe_->Send(call.SerializeAsString(), deadline);
    absl::StatusOr<std::string> bytes = s.ok() ? pipe_->Recv(deadline) : absl::StatusOr<std::string>(s);
    v1::DataPlaneReply reply;
    if (bytes.ok() && !reply.ParseFromString(*bytes)) bytes = absl::DataLossError("an unreadable reply");
    if (!bytes.ok()) {
      broken_ = absl::UnavailableError(absl::StrCat("nccl peer ", peer_, ": ", bytes.status().message()));
      pipe_->Abort();
      return broken_;
    }
    if (reply.code() != 0) return absl::Status(static_cast<absl::StatusCode>(reply.code()), reply.message());
    return reply;
  }

  const std::string peer_;
  absl::Mutex mu_;
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
    // The server validates and starts joining in the background, then we join.
    auto stub = v1::NcclDataPlane::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(),
                                                                     InternalChannelArgs()));
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.connect_timeout));
    v1::OpenNcclRequest req;
    req.set_unique_id(id);
    req.set_client(absl::StrCat("pid ", getpid(), " cuda:", options_.device));
    v1::OpenNcclResponse resp;
    grpc::Status g = stub->Open(&ctx, req, &resp);
    if (!g.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(g.error_code()),
                          absl::StrCat("nccl peer ", address, ": Open: ", g.error_message()));
    }
    absl::StatusOr<std::unique_ptr<BytePipe>> pipe =
        cuda->open_nccl_pipe(id, /*rank=*/0, options_.device, absl::Now() + options_.connect_timeout);
    if (!pipe.ok()) {
      return absl::UnavailableError(absl::StrCat("nccl peer ", address, " (cuda:", resp.device(), "): ",
                                                 pipe.status().message()));
    }
    return std::unique_ptr<DataChannel>(new NcclChannel(address, std::move(*pipe), options_.call_timeout));
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
  RETURN_IF_ERROR(CudaBackends().status());  // no plugin: say so now, not at the first Open
  std::unique_ptr<NcclDataPlaneServer> s(new NcclDataPlaneServer(device, dispatch, kv));
  ASSIGN_OR_RETURN(RunningServer running, StartGrpcServer(listen, {s.get()}));
  s->server_ = std::move(running.server);
  s->port_ = running.port;
  return s;
}

NcclDataPlaneServer::~NcclDataPlaneServer() {
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (BytePipe* p : pipes_) p->Abort();
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

grpc::Status NcclDataPlaneServer::Open(grpc::ServerContext*, const v1::OpenNcclRequest* request,
                                       v1::OpenNcclResponse* response) {
  if (request->unique_id().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no unique id");
  absl::MutexLock lock(&mu_);
  if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "shutting down");
  threads_.emplace_back([this, id = request->unique_id(), client = request->client()] { Serve(id, client); });
  response->set_device(device_);
  return grpc::Status::OK;
}

void NcclDataPlaneServer::Serve(std::string unique_id, std::string client) {
  absl::StatusOr<const CudaBackendsTable*> cuda = CudaBackends();
  absl::StatusOr<std::unique_ptr<BytePipe>> pipe =
      cuda.ok() ? (*cuda)->open_nccl_pipe(unique_id, /*rank=*/1, device_, absl::Now() + absl::Seconds(60))
                : absl::StatusOr<std::unique_ptr<BytePipe>>(cuda.status());
  if (!pipe.ok()) {
    std::cerr << "nccl data plane: channel from " << client << " not opened: " << pipe.status() << std::endl;
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    pipes_.push_back(pipe->get());
  }
  while (true) {
    absl::StatusOr<std::string> call = (*pipe)->Recv(absl::InfiniteFuture());
    if (!call.ok() || call->empty()) break;  // aborted, broken, or closed by the client
    if (absl::Status s = (*pipe)->Send(Handle(*call), absl::Now() + absl::Seconds(60)); !s.ok()) break;
  }
  absl::MutexLock lock(&mu_);
  pipes_.erase(std::find(pipes_.begin(), pipes_.end(), pipe->get()));
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
