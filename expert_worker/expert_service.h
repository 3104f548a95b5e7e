// The expert worker's core: its shard of routed experts, serving dispatch for
// any MoE layer. Dispatches that arrive together for the same layer (from
// several attention workers) are merged into one grouped computation;
// device-resident dispatches (cuda_ipc) run one by one on the GPU.
//
// Thread-safe: Dispatch is called concurrently by the transport.
#ifndef MOESH_EXPERT_WORKER_EXPERT_SERVICE_H_
#define MOESH_EXPERT_WORKER_EXPERT_SERVICE_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"
#include "common/model/expert_client.h"
#include "common/transport/transport.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

// Loads the given experts' weights (the expert worker's checkpoint).
using ExpertLoader =
    std::function<absl::StatusOr<std::unique_ptr<ExpertShardWeights>>(const std::set<int>&)>;

struct ExpertServiceOptions {
  // How long the first dispatch of a layer waits for others to join its batch
  // — while there are others: after `solo_batches` batches in a row that
  // nobody joined, and no dispatch arriving while another was in flight for
  // a second (one attention worker), dispatches run at once.
  std::chrono::microseconds batch_window{200};
  int solo_batches = 16;
  Metrics* metrics = nullptr;  // may be null
  ExpertLoader loader;         // null: LoadExperts is UNIMPLEMENTED
};

class ExpertService : public DispatchHandler,
                      public DeviceDispatchHandler,
                      public v1::ExpertWorker::Service {
 public:
  ExpertService(std::unique_ptr<ExpertStage> stage, std::string fingerprint,
                ExpertServiceOptions options);

  // DispatchHandler.
  absl::Status Dispatch(const v1::DispatchRequest& request,
                        v1::DispatchResponse* response) override;
  // DeviceDispatchHandler (cuda_ipc): runs at once on the stage's GPU, not
  // merged with other attention workers' dispatches (each waits its turn on
  // the device).
  absl::Status DispatchOnDevice(const DeviceMoeDispatch& dispatch, float* out) override;
  // ExpertWorker.Info.
  grpc::Status Info(grpc::ServerContext*, const v1::ExpertInfoRequest*,
                    v1::ExpertInfoResponse* response) override;
  grpc::Status LoadExperts(grpc::ServerContext*, const v1::LoadExpertsRequest* request,
                           v1::LoadExpertsResponse* response) override;
  // Heartbeat payload: tokens served per expert.
  v1::WorkerLoad Load() const;

  // Merged computations run so far, and dispatches they served (for tests and
  // metrics: batches < dispatches means merging happened).
  int64_t num_batches() const;
  // What ExpertWorker.Info reports as the data-plane address (empty: gRPC).
  void set_data_plane_address(std::string address) { data_plane_address_ = std::move(address); }
  int64_t num_dispatches() const;

 private:
  struct Batch {
    std::vector<const v1::DispatchRequest*> requests;
    std::vector<v1::DispatchResponse*> responses;
    bool started = false;
    bool done = false;
    absl::Status status;
  };
  absl::Status Validate(const v1::DispatchRequest& r) const;
  absl::Status RunBatch(Batch* batch);

  void Record(const MoeDispatch& d, double seconds, size_t num_requests);

  const std::unique_ptr<ExpertStage> stage_;
  const std::string fingerprint_;
  const ExpertServiceOptions options_;
  std::string data_plane_address_;  // set before serving

  mutable absl::Mutex mu_;
  std::map<int, std::shared_ptr<Batch>> open_
      ABSL_GUARDED_BY(mu_);  // layer -> batch taking joiners
  int64_t batches_ ABSL_GUARDED_BY(mu_) = 0;
  int solo_streak_ ABSL_GUARDED_BY(mu_) = 0;  // batches in a row that nobody joined
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;    // dispatches inside Dispatch
  std::chrono::steady_clock::time_point last_overlap_
      ABSL_GUARDED_BY(mu_);  // one arrived while another ran
  int64_t dispatches_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<int64_t> expert_load_ ABSL_GUARDED_BY(mu_);  // [n_routed_experts]
  absl::Mutex load_mu_;                                    // serialises LoadExperts
  // [n_routed_experts]: hosted now (less `leaving`); replaced whole by
  // LoadExperts, read per dispatch.
  void SetHosted(const std::set<int>& leaving = {});
  mutable absl::Mutex hosted_mu_;
  std::shared_ptr<const std::vector<bool>> hosted_ ABSL_GUARDED_BY(hosted_mu_);
  // Per (layer, expert) token counters, added as experts are (LoadExperts);
  // none without metrics.
  prometheus::Family<prometheus::Counter>* expert_tokens_family_ = nullptr;
  absl::Mutex counters_mu_;
  std::map<std::pair<int, int>, prometheus::Counter*> expert_tokens_ ABSL_GUARDED_BY(counters_mu_);
  prometheus::Histogram* compute_seconds_ = nullptr;
  prometheus::Counter* batches_counter_ = nullptr;
  prometheus::Counter* dispatches_counter_ = nullptr;
};

}  // namespace moesh

#endif  // MOESH_EXPERT_WORKER_EXPERT_SERVICE_H_
