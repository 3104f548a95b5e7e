// The seam between the attention half and the routed-expert half of an MoE
// layer (DESIGN.md "one model, split at the MoE boundary").
//
// The attention side computes, per token, the normalised hidden state and its
// top-k (expert id, weight) pairs; an ExpertClient returns Σ_k w_k·E_k(h).
// Implementations: LocalExpertClient (experts in this process) here; remote
// clients over a transport live with the services.
#ifndef MOESH_COMMON_MODEL_EXPERT_CLIENT_H_
#define MOESH_COMMON_MODEL_EXPERT_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/model/config.h"
#include "common/model/moe_dispatch.h"
#include "common/model/weights.h"

namespace moesh {

class ExpertClient {
 public:
  virtual ~ExpertClient() = default;
  // out[num_tokens, hidden] (fp32, in the dispatch's memory) =
  // Σ_k topk_weights[t, k] · Expert_{topk_ids[t, k]}(h_t), overwriting out.
  // Host memory: complete on return. Device memory: complete once
  // dispatch.ready has fired and, on return, delivered on dispatch.stream
  // (moe_dispatch.h). UNIMPLEMENTED for memory that memory_kinds() does not
  // take. Thread-safety is the implementation's to state.
  virtual absl::Status Run(const MoeDispatch& dispatch, float* out) = 0;
  // Like Run, but may return before the experts finish so the caller can
  // compute meanwhile (ping-pong micro-batching, the shared expert); the
  // handle's Wait completes it. The dispatch's buffers and `out` must stay
  // valid until Wait returns. The default runs synchronously.
  virtual std::unique_ptr<PendingDispatch> Start(const MoeDispatch& dispatch, float* out);
  // True iff Start overlaps (so splitting a batch pays off).
  virtual bool IsAsync() const { return false; }
  // The memory Run takes dispatches in: host f32, and a CUDA device's bf16
  // where the transport moves GPU memory (cuda_ipc, nccl).
  virtual MemoryKinds memory_kinds() const { return {}; }
  // Device dispatches only. Call once the caller's stream is done with every
  // result Run delivered on a stream since the last call: OK if they are all
  // sound; UNAVAILABLE if a worker failed meanwhile (it is routed around from
  // now on; the results are not to be used, the step is to be run again).
  // This is the honest contract of transports that answer after the fact
  // (nccl: the server's answer is read once the step is done, so that no host
  // waits per layer); those that answer within Run (cuda_ipc) always return OK.
  virtual absl::Status CheckDeviceDispatches() { return absl::OkStatus(); }
};

// The expert FFNs of one shard: for every MoE layer, a grouped computation over
// the tokens routed to the shard's experts. Thread-safe (read-only weights).
// Experts can be added while serving (AddShard: replicas placed by the
// rebalancer); a dispatch already running uses the experts it started with.
//
// This class computes on the CPU in fp32 (host dispatches only);
// common/cuda_backend's CudaExpertStage overrides Accumulate and AddShard to
// compute on a GPU (bf16 weights; host and device dispatches), keeping this
// class's bookkeeping of what is hosted.
class ExpertStage {
 public:
  ExpertStage(const ModelConfig& config, std::unique_ptr<ExpertShardWeights> weights);
  virtual ~ExpertStage() = default;

  // The weighted outputs of the (token, expert) pairs whose expert is in
  // this shard (a device dispatch's: and in dispatch.serve, where set);
  // other pairs are skipped.
  // Host memory (f32): added into out[num_tokens, hidden], so the sums of
  // several shards add up. Device memory (bf16, CudaExpertStage on that
  // device): out (device, fp32 [num_tokens, hidden]) is overwritten; the
  // call returns once the device is done, or, with dispatch.done, once the
  // work is enqueued; `counted`, if not null, gets the dispatches whose
  // pairs are now known on the host (this one when it waited; an earlier one
  // that did not wait, once it is done). INVALID_ARGUMENT for a dense layer,
  // a wrong hidden size or an expert id beyond n_routed_experts;
  // UNIMPLEMENTED for memory that memory_kinds() does not take.
  virtual absl::Status Accumulate(const MoeDispatch& dispatch, float* out,
                                  std::vector<CountedDispatch>* counted = nullptr) const;
  // The memory Accumulate takes: host f32 here; CudaExpertStage adds its device.
  virtual MemoryKinds memory_kinds() const { return {}; }

  // OK, or an error (e.g. the device lacks memory) leaving the stage as it was.
  virtual absl::Status AddShard(std::unique_ptr<ExpertShardWeights> more);
  // Stops hosting `ids` (replicas the placement no longer routes to) and
  // frees their weights once no running dispatch uses them. INVALID_ARGUMENT
  // (and the stage as it was) if that would leave no expert. Not
  // concurrently with AddShard (ExpertService serialises them).
  virtual absl::Status RemoveExperts(const std::set<int>& ids);
  // Where the experts run: "cpu", "cuda:0", ...
  virtual std::string device() const { return "cpu"; }
  std::set<int> expert_ids() const;  // every expert hosted
  std::vector<int> moe_layers() const;
  bool IsMoeLayer(int layer) const;
  const ModelConfig& config() const { return config_; }

 protected:
  using Shards = std::vector<std::shared_ptr<const ExpertShardWeights>>;
  Shards shards() const;
  // The shards without `ids` (shards losing some are copied without them;
  // emptied ones go); INVALID_ARGUMENT if no expert would be left.
  absl::StatusOr<Shards> ShardsWithout(const std::set<int>& ids) const;
  void SetShards(Shards shards);

 private:
  const ModelConfig config_;
  mutable absl::Mutex mu_;
  Shards shards_ ABSL_GUARDED_BY(mu_);
};

// All routed experts in this process. Thread-safe.
class LocalExpertClient : public ExpertClient {
 public:
  // Host dispatches. REQUIRES: stage holds every routed expert.
  explicit LocalExpertClient(std::unique_ptr<ExpertStage> stage) : stage_(std::move(stage)) {}
  absl::Status Run(const MoeDispatch& dispatch, float* out) override;

 private:
  const std::unique_ptr<ExpertStage> stage_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_EXPERT_CLIENT_H_
