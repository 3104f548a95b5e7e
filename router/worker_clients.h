// The prefill and decode workers as seen from the router: the request flow's
// clients (common/serving/generation_flow.h) over gRPC. A call in flight is
// tracked by the worker registry, which cancels it if its worker is dropped (so a
// dead worker fails its requests at once), and the caller's CancelToken
// cancels it (ClientContext::TryCancel) the moment it fires. Errors name the worker; a worker
// that vanished mid-call reads as UNAVAILABLE. Thread-safe.
#ifndef MOESH_ROUTER_WORKER_CLIENTS_H_
#define MOESH_ROUTER_WORKER_CLIENTS_H_

#include <memory>
#include <string>

#include "common/serving/generation_flow.h"
#include "grpcpp/channel.h"
#include "moesh/v1/worker.grpc.pb.h"
#include "router/worker_registry.h"

namespace moesh {

class GrpcPrefillClient : public PrefillClient {
 public:
  // `registry` is borrowed and must outlive the client.
  GrpcPrefillClient(WorkerInfo worker, std::shared_ptr<grpc::Channel> channel,
                    WorkerRegistry* registry);
  absl::Status Prefill(const PrefillSpec& spec, const CancelToken& cancel) override;

 private:
  const WorkerInfo worker_;
  const std::unique_ptr<v1::PrefillWorker::Stub> stub_;
  WorkerRegistry* const registry_;
};

class GrpcDecodeClient : public DecodeClient {
 public:
  // `registry` is borrowed and must outlive the client.
  GrpcDecodeClient(WorkerInfo worker, std::shared_ptr<grpc::Channel> channel,
                   WorkerRegistry* registry);
  const std::string& kv_address() const override { return worker_.data_plane_address; }
  // One DecodeWorker.Decode stream: its first message says the blocks are
  // reserved, the rest are the request's tokens.
  absl::StatusOr<std::unique_ptr<DecodeStream>> Open(const DecodeSpec& spec,
                                                     const CancelToken& cancel) override;

 private:
  const WorkerInfo worker_;
  const std::unique_ptr<v1::DecodeWorker::Stub> stub_;
  WorkerRegistry* const registry_;
};

}  // namespace moesh

#endif  // MOESH_ROUTER_WORKER_CLIENTS_H_
