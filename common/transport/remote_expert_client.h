// An ExpertClient whose routed experts live in expert workers reached through
// a Transport: per MoE layer, the tokens are split by the worker hosting each
// (token, expert) pair, sent to all workers concurrently, and the partial sums
// added up (dispatch → expert FFNs → combine).
//
// Replicas: an expert hosted by several workers goes to its live replicas in
// turn, one dispatch after another (its load split evenly over them, as the
// rebalancer assumes). A worker whose call fails is marked down for `retry_after` (its
// channel dropped; the next call after that connects anew, so a restarted
// worker is picked up) and the layer is re-dispatched over the remaining
// replicas, so losing a worker is invisible while every expert keeps a live
// replica; otherwise the step returns UNAVAILABLE. Errors of this process's
// own (a device out of memory, a missing CUDA plugin) are returned as they
// are, blaming no worker. Thread-safe (device-resident dispatches run one at
// a time).
#ifndef MOESH_COMMON_TRANSPORT_REMOTE_EXPERT_CLIENT_H_
#define MOESH_COMMON_TRANSPORT_REMOTE_EXPERT_CLIENT_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "base/thread_pool.h"
#include "common/metrics/metrics.h"
#include "common/model/expert_client.h"
#include "common/transport/transport.h"

namespace moesh {

// Which experts each worker hosts: address -> expert ids.
using ExpertPlacement = std::map<std::string, std::vector<int>>;

class RemoteExpertClient : public ExpertClient {
 public:
  // INVALID_ARGUMENT unless every expert in [0, num_experts) has a host.
  static absl::StatusOr<std::unique_ptr<RemoteExpertClient>> Create(
      Transport* transport, const ExpertPlacement& placement, int num_experts,
      std::chrono::milliseconds retry_after = std::chrono::seconds(5), Metrics* metrics = nullptr);

  absl::Status Run(const MoeDispatch& dispatch, float* out) override;
  // Runs the dispatch on a background thread.
  std::unique_ptr<PendingDispatch> Start(const MoeDispatch& dispatch, float* out) override;
  bool IsAsync() const override { return true; }
  // Device-resident dispatch where every channel takes it on one device
  // (cuda_ipc): each worker gets the whole dispatch with a mask of the
  // experts it is to serve; their partial sums are added on the device.
  // Replicas and failover as for Run.
  int dispatch_device() const override;
  absl::Status RunOnDevice(const DeviceMoeDispatch& dispatch, float* out) override;
  // Reads every channel's answers (nccl answers after the fact): a worker
  // that failed is marked down as in Run, and UNAVAILABLE names it; so does
  // a worker dropped since the last call while answers were outstanding.
  absl::Status CheckDeviceDispatches() override;

  // Switches to a new placement (e.g. the router's map changed). Dispatches
  // already running finish on the old one; none fails because of the switch.
  // INVALID_ARGUMENT (and the old placement stays) unless every expert has a
  // host.
  absl::Status UpdatePlacement(const ExpertPlacement& placement);

 private:
  struct Worker {
    std::string address;
  };
  // An immutable placement snapshot.
  struct Routing {
    std::vector<Worker> workers;
    std::vector<std::vector<int>> hosts;  // expert -> worker indices
    int dispatch_device = -1;             // every channel's, or -1
  };
  RemoteExpertClient(Transport* transport, int num_experts, std::chrono::milliseconds retry_after)
      : transport_(transport), num_experts_(num_experts), retry_after_(retry_after) {}

  // One attempt over the current routes; marks failed workers down.
  absl::Status RunOnce(const Routing& routing, const MoeDispatch& dispatch, float* out);
  absl::Status RunOnceOnDevice(const Routing& routing, const DeviceMoeDispatch& dispatch,
                               float* out);
  // Retries `once` while workers fail and replicas are left; observes the round trip.
  template <typename Once>
  absl::Status WithFailover(Once once);
  // For each expert, the worker index serving it now; UNAVAILABLE if an
  // expert has no live replica.
  absl::StatusOr<std::vector<int>> Route(const Routing& routing);
  // Marks the worker down and drops its channel (calls holding it finish).
  void MarkDown(const std::string& address);
  // A worker that failed a call with `error` `when` ("layer 3"): marked down,
  // counted and logged; UNAVAILABLE naming it.
  absl::Status DropWorker(const std::string& address, const absl::Status& error,
                          absl::string_view when);
  // The worker's channel, connecting (outside mu_) if there is none.
  absl::StatusOr<std::shared_ptr<DataChannel>> Channel(const std::string& address);
  std::shared_ptr<const Routing> routing() const;

  Transport* const transport_;
  const int num_experts_;
  const std::chrono::milliseconds retry_after_;
  prometheus::Histogram* roundtrip_ = nullptr;  // null without metrics
  prometheus::Counter* errors_ = nullptr;

  mutable absl::Mutex mu_;
  std::shared_ptr<const Routing> routing_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<DataChannel>> channels_ ABSL_GUARDED_BY(mu_);
  absl::Mutex device_mu_;  // one device-resident dispatch at a time (channels hold one in flight)
  // A worker dropped while device results were unchecked: they are suspect.
  absl::Status device_suspect_ ABSL_GUARDED_BY(device_mu_);
  std::map<std::string, std::chrono::steady_clock::time_point> down_until_ ABSL_GUARDED_BY(mu_);
  uint64_t turn_ ABSL_GUARDED_BY(mu_) = 0;  // dispatches routed so far
  // Runs Start's dispatches and a dispatch's sends to several workers: threads
  // reused across calls, not one per call. Last member: joined first.
  ThreadPool pool_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_REMOTE_EXPERT_CLIENT_H_
