// gRPC edge of the decode worker: DecodeWorker RPCs onto the DecodeEngine.
//
// Decode is a callback-API stream: on a thread of the service's pool it
// reserves the request's prompt blocks (waiting in the engine's admission
// queue while they are not free), says so ({reserved}), and streams the
// engine's events once the KV arrived; the router cancelling the stream (or
// going away) fires the request's CancelToken, which wakes the engine: a
// request waiting for its KV ends at once, a running one leaves the batch at
// the next step; either way its blocks are freed. Nothing polls.
#ifndef MOESH_DECODE_WORKER_DECODE_SERVICE_H_
#define MOESH_DECODE_WORKER_DECODE_SERVICE_H_

#include "base/thread_pool.h"
#include "common/serving/decode_engine.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

class DecodeService final
    : public v1::DecodeWorker::WithCallbackMethod_Decode<v1::DecodeWorker::Service> {
 public:
  explicit DecodeService(DecodeEngine* engine) : engine_(engine) {}

  grpc::ServerWriteReactor<v1::DecodeResponse>* Decode(grpc::CallbackServerContext* ctx,
                                                       const v1::DecodeRequest* request) override;

 private:
  DecodeEngine* const engine_;
  ThreadPool pool_;  // last: its threads finish before the engine pointer goes
};

}  // namespace moesh

#endif  // MOESH_DECODE_WORKER_DECODE_SERVICE_H_
