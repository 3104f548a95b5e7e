// gRPC edge of the prefill worker: PrefillWorker.Prefill onto the PrefillEngine.
//
// Prefill is a callback-API call run on a thread of the service's pool; the
// router cancelling it fires its CancelToken, which takes a prompt still
// queued out of the engine's queue at once.
#ifndef MOESH_PREFILL_WORKER_PREFILL_SERVICE_H_
#define MOESH_PREFILL_WORKER_PREFILL_SERVICE_H_

#include "base/thread_pool.h"
#include "common/serving/prefill_engine.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

class PrefillService final
    : public v1::PrefillWorker::WithCallbackMethod_Prefill<v1::PrefillWorker::Service> {
 public:
  explicit PrefillService(PrefillEngine* engine) : engine_(engine) {}
  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* ctx,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;

 private:
  PrefillEngine* const engine_;
  ThreadPool pool_;  // last: its threads finish before the engine pointer goes
};

}  // namespace moesh

#endif  // MOESH_PREFILL_WORKER_PREFILL_SERVICE_H_
