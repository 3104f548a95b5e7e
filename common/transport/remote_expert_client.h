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
// are, blaming no worker.
//
// Both memory kinds take the same routes and failover. A host dispatch is
// split by token: each worker gets the tokens with a pair of its experts
// (compacted; the whole dispatch, written in place, where one worker has
// every pair), sent concurrently from a fixed pool, and the partial sums are
// added on the host. A device dispatch (where every channel moves this
// process's GPU memory: cuda_ipc, nccl) goes whole to each worker with a
// mask of the experts it is to serve (DataChannel::Post), and the partial
// sums are added on the device (Collect). Thread-safe (device-resident
// dispatches run one at a time: a channel holds one posted dispatch).
#ifndef MOESH_COMMON_TRANSPORT_REMOTE_EXPERT_CLIENT_H_
#define MOESH_COMMON_TRANSPORT_REMOTE_EXPERT_CLIENT_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
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
  // `wire`: how host dispatches travel where the transport carries them as
  // messages (grpc, ucx, nccl's host calls: dispatch_wire.h;
  // --dispatch_dtype); device dispatches move their buffers as they are.
  static absl::StatusOr<std::unique_ptr<RemoteExpertClient>> Create(
      Transport* transport, const ExpertPlacement& placement, int num_experts,
      std::chrono::milliseconds retry_after = std::chrono::seconds(5), Metrics* metrics = nullptr,
      DispatchWire wire = {});

  absl::Status Run(const MoeDispatch& dispatch, float* out) override;
  // Runs the dispatch on the client's pool (threads reused, not one per call).
  std::unique_ptr<PendingDispatch> Start(const MoeDispatch& dispatch, float* out) override;
  bool IsAsync() const override { return true; }
  // Host f32, and the device every channel moves (if they agree on one).
  MemoryKinds memory_kinds() const override;
  // Reads every channel's answers (DataChannel::CheckCollected; nccl answers
  // after the fact): a worker that failed is marked down as in Run, and
  // UNAVAILABLE names it; so does a worker dropped since the last call while
  // answers were outstanding.
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
    MemoryKinds kinds;                    // what every channel moves
  };
  RemoteExpertClient(Transport* transport, int num_experts, std::chrono::milliseconds retry_after,
                     DispatchWire wire)
      : transport_(transport), num_experts_(num_experts), retry_after_(retry_after), wire_(wire) {}

  // One attempt over the current routes; marks failed workers down.
  absl::Status RunOnce(const Routing& routing, const MoeDispatch& dispatch, float* out);
  // RunOnce's data movement per memory kind, over `route` (expert -> worker).
  absl::Status RunHost(const Routing& routing, const std::vector<int>& route,
                       const MoeDispatch& dispatch, float* out);
  absl::Status RunDevice(const Routing& routing, const std::vector<int>& route,
                         const MoeDispatch& dispatch, float* out);  // under device_mu_
  // After a dispatch's calls (`status(w)`: worker w's, OK where it had none):
  // every worker whose call failed is marked down. Returns OK, UNAVAILABLE
  // naming a worker gone, an answer of the wrong size's DATA_LOSS
  // (dispatch_wire.h), or a device dispatch's refusal (INVALID_ARGUMENT: the
  // caller's, blaming no worker from there on).
  absl::Status Blame(const Routing& routing, const MoeDispatch& dispatch,
                     absl::FunctionRef<const absl::Status&(int w)> status);
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
  const DispatchWire wire_;
  prometheus::Histogram* roundtrip_ = nullptr;   // null without metrics
  prometheus::Counter* hidden_bytes_ = nullptr;  // host dispatches' hidden states sent
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
