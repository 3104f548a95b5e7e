// The expert worker's core: its shard of routed experts, serving dispatches
// for any MoE layer. Dispatches that arrive together for the same layer (from
// several attention workers) are merged into one grouped computation;
// device-resident dispatches (cuda_ipc, nccl) run one by one on the GPU.
// Plain types only: the RPC and transport adapter is ExpertService.
//
// Thread-safe: Dispatch is called concurrently by the transports' threads.
#ifndef MOESH_EXPERT_WORKER_EXPERT_DISPATCHER_H_
#define MOESH_EXPERT_WORKER_EXPERT_DISPATCHER_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"
#include "common/model/expert_client.h"

namespace moesh {

// Loads the given experts' weights (the expert worker's checkpoint).
using ExpertLoader =
    std::function<absl::StatusOr<std::unique_ptr<ExpertShardWeights>>(const std::set<int>&)>;

struct ExpertDispatcherOptions {
  // How long the first dispatch of a layer waits for others to join its batch
  // — while there are others: after `solo_batches` batches in a row that
  // nobody joined, and no dispatch arriving while another was in flight for
  // a second (one attention worker), dispatches run at once.
  std::chrono::microseconds batch_window{200};
  int solo_batches = 16;
  Metrics* metrics = nullptr;  // may be null
  ExpertLoader loader;         // null: LoadExperts is UNIMPLEMENTED
  // Asked before an exact LoadExperts drops hosted experts (`drop`): OK, or
  // why not (nothing is dropped then). Null: every drop is allowed. The
  // worker's is expert_worker/placement_guard.h's rule.
  std::function<absl::Status(const std::set<int>& drop)> may_drop;
};

class ExpertDispatcher {
 public:
  ExpertDispatcher(std::unique_ptr<ExpertStage> stage, ExpertDispatcherOptions options);

  // Overwrites `out` (fp32 [d.num_tokens, d.hidden], in d's memory) with
  // this worker's weighted sums of d's (token, expert) pairs.
  // Host memory: merged with other dispatches of the same layer that arrive
  // within the batch window; blocks until done. Device memory (the stage's
  // GPU: cuda_ipc, nccl): runs at once there, not merged with other
  // attention workers' dispatches (each waits its turn), and with d.done
  // returns once enqueued (ExpertStage::Accumulate). INVALID_ARGUMENT for
  // bad dimensions, a dense layer or an expert id out of range;
  // FAILED_PRECONDITION for a pair of an expert not hosted here (a stale
  // placement map: refused, never skipped); UNIMPLEMENTED for memory the
  // stage does not take.
  absl::Status Dispatch(const MoeDispatch& d, float* out);

  // Loads `ids` not hosted yet (from the loader) and, with `exact`, drops the
  // hosted experts not listed, if options.may_drop allows (checked before
  // anything is loaded). Returns the experts hosted after.
  // INVALID_ARGUMENT for an id out of range or an empty exact set;
  // UNIMPLEMENTED without a loader; may_drop's refusal.
  absl::StatusOr<std::set<int>> LoadExperts(const std::vector<int>& ids, bool exact);

  const ModelConfig& config() const { return stage_->config(); }
  std::set<int> hosted_experts() const { return stage_->expert_ids(); }
  // Tokens served per expert since start, indexed by expert id.
  std::vector<int64_t> expert_load() const;
  // Merged computations run so far, and dispatches they served (batches <
  // dispatches means merging happened).
  int64_t num_batches() const;
  int64_t num_dispatches() const;

 private:
  struct Batch {
    std::vector<const MoeDispatch*> dispatches;
    std::vector<float*> outs;
    bool started = false;
    bool done = false;
    absl::Status status;
  };
  absl::Status Validate(const MoeDispatch& d) const;
  // Dispatch of a device dispatch.
  absl::Status DispatchOnDevice(const MoeDispatch& d, float* out);
  absl::Status RunBatch(Batch* batch);
  void Record(const MoeDispatch& d, double seconds, size_t num_dispatches);
  // [n_routed_experts]: hosted now (less `leaving`).
  void SetHosted(const std::set<int>& leaving = {});

  const std::unique_ptr<ExpertStage> stage_;
  const ExpertDispatcherOptions options_;

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
  // Replaced whole by LoadExperts, read per dispatch.
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

#endif  // MOESH_EXPERT_WORKER_EXPERT_DISPATCHER_H_
