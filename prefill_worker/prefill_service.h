// gRPC edge of the prefill worker: PrefillWorker.Prefill onto the PrefillEngine.
#ifndef MOESH_PREFILL_WORKER_PREFILL_SERVICE_H_
#define MOESH_PREFILL_WORKER_PREFILL_SERVICE_H_

#include "common/serving/prefill_engine.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

class PrefillService final : public v1::PrefillWorker::Service {
 public:
  explicit PrefillService(PrefillEngine* engine) : engine_(engine) {}
  grpc::Status Prefill(grpc::ServerContext*, const v1::PrefillRequest* request,
                       v1::PrefillResponse* response) override;

 private:
  PrefillEngine* const engine_;
};

}  // namespace moesh

#endif  // MOESH_PREFILL_WORKER_PREFILL_SERVICE_H_
