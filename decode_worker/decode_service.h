// gRPC edge of the decode worker: DecodeWorker RPCs onto the DecodeEngine.
#ifndef MOESH_DECODE_WORKER_DECODE_SERVICE_H_
#define MOESH_DECODE_WORKER_DECODE_SERVICE_H_

#include "common/serving/decode_engine.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

class DecodeService final : public v1::DecodeWorker::Service {
 public:
  explicit DecodeService(DecodeEngine* engine) : engine_(engine) {}

  grpc::Status Reserve(grpc::ServerContext*, const v1::ReserveRequest* request,
                       v1::ReserveResponse*) override;
  grpc::Status Decode(grpc::ServerContext* ctx, const v1::DecodeRequest* request,
                      grpc::ServerWriter<v1::DecodeResponse>* writer) override;
  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse*) override;

 private:
  DecodeEngine* const engine_;
};

}  // namespace moesh

#endif  // MOESH_DECODE_WORKER_DECODE_SERVICE_H_
