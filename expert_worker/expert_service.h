// The expert worker's RPC and transport edge over its core (ExpertDispatcher):
// the data plane's dispatches (plain MoeDispatch, host or device-resident:
// the transports check and view their wire messages,
// common/transport/dispatch_wire.h), and moesh.v1.ExpertWorker (Info, LoadExperts);
// the heartbeat's load.
//
// Thread-safe: Dispatch is called concurrently by the transports.
#ifndef MOESH_EXPERT_WORKER_EXPERT_SERVICE_H_
#define MOESH_EXPERT_WORKER_EXPERT_SERVICE_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "common/transport/transport.h"
#include "expert_worker/expert_dispatcher.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

using ExpertServiceOptions = ExpertDispatcherOptions;

class ExpertService : public DispatchHandler, public v1::ExpertWorker::Service {
 public:
  ExpertService(std::unique_ptr<ExpertStage> stage, std::string fingerprint,
                ExpertServiceOptions options);

  // DispatchHandler: ExpertDispatcher::Dispatch (either memory kind).
  absl::Status Dispatch(const MoeDispatch& dispatch, float* out) override;
  // ExpertWorker.Info.
  grpc::Status Info(grpc::ServerContext*, const v1::ExpertInfoRequest*,
                    v1::ExpertInfoResponse* response) override;
  grpc::Status LoadExperts(grpc::ServerContext*, const v1::LoadExpertsRequest* request,
                           v1::LoadExpertsResponse* response) override;
  // Heartbeat payload: tokens served per expert.
  v1::WorkerLoad Load() const;

  // Dispatches being served now, plus one while the last one ended less than
  // `quiet` ago: what a drain waits for (attention workers still routing by
  // a map that has this worker send more until they follow the new one).
  int InFlight(std::chrono::steady_clock::duration quiet) const;

  ExpertDispatcher& dispatcher() { return dispatcher_; }
  int64_t num_batches() const { return dispatcher_.num_batches(); }
  int64_t num_dispatches() const { return dispatcher_.num_dispatches(); }
  // What ExpertWorker.Info reports as the data-plane address (empty: gRPC).
  void set_data_plane_address(std::string address) { data_plane_address_ = std::move(address); }

 private:
  ExpertDispatcher dispatcher_;
  const std::string fingerprint_;
  std::string data_plane_address_;  // set before serving
  std::atomic<int> in_flight_{0};
  // When the last dispatch ended (steady clock ticks); 0: none yet.
  std::atomic<int64_t> last_dispatch_end_{0};
};

}  // namespace moesh

#endif  // MOESH_EXPERT_WORKER_EXPERT_SERVICE_H_
