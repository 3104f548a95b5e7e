// gRPC edge of the decode worker: DecodeWorker RPCs onto the DecodeEngine.
//
// Decode is a callback-API stream: the engine's Decode runs on a thread of the
// service's pool, and the router cancelling the stream (or going away) fires
// the request's CancelToken, which wakes the engine: the request leaves the
// batch at the next step and its blocks are freed. Nothing polls.
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

  grpc::Status Reserve(grpc::ServerContext*, const v1::ReserveRequest* request,
                       v1::ReserveResponse*) override;
  grpc::ServerWriteReactor<v1::DecodeResponse>* Decode(grpc::CallbackServerContext* ctx,
                                                       const v1::DecodeRequest* request) override;
  grpc::Status Release(grpc::ServerContext*, const v1::ReleaseRequest* request,
                       v1::ReleaseResponse*) override;

 private:
  DecodeEngine* const engine_;
  ThreadPool pool_;  // last: its threads finish before the engine pointer goes
};

}  // namespace moesh

#endif  // MOESH_DECODE_WORKER_DECODE_SERVICE_H_
