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
#include "common/model/weights.h"

namespace moesh {

// One MoE layer's worth of tokens to route. Borrowed pointers.
struct MoeDispatch {
  int layer = 0;
  int num_tokens = 0;
  int hidden = 0;
  int top_k = 0;
  const float* hidden_states = nullptr;  // [num_tokens, hidden]
  const int32_t* topk_ids = nullptr;     // [num_tokens, top_k], in [0, n_routed_experts); -1: skip
  const float* topk_weights = nullptr;   // [num_tokens, top_k]
};

// The same, resident in one CUDA device's memory (the cuda_ipc transport):
// hidden states already rounded to bf16, as the GPU experts take them.
// Borrowed device pointers; `serve` is host memory.
struct DeviceMoeDispatch {
  int layer = 0;
  int num_tokens = 0;
  int hidden = 0;
  int top_k = 0;
  const uint16_t* hidden_states = nullptr;  // bf16 [num_tokens, hidden]
  const int32_t* topk_ids = nullptr;        // [num_tokens, top_k]; -1: skip
  const float* topk_weights = nullptr;      // [num_tokens, top_k]
  // Host [n_routed_experts]: nonzero for the experts whose pairs to run here
  // (the rest are another worker's replicas); null: every hosted expert.
  const uint8_t* serve = nullptr;
  int num_experts = 0;  // serve's length: n_routed_experts
  // The caller's CUDA stream and event (cudaStream_t, cudaEvent_t) for
  // ExpertClient::RunOnDevice: the inputs are complete once `ready` fires
  // (null: already), and the result is delivered on `stream`, ordered after
  // the call returns (null: complete on return).
  void* ready = nullptr;
  void* stream = nullptr;
  // ExpertStage::AccumulateOnDevice only: a cudaEvent_t to record once `out`
  // is written; the call then returns without waiting for the device
  // (`ready` is then waited for on the device too).
  void* done = nullptr;
};

// The (token, expert) pairs of a device dispatch that ran here, for load
// accounting: topk_ids with the pairs not served here as -1.
struct CountedDispatch {
  int layer = -1;
  int num_tokens = 0, top_k = 0;
  std::vector<int32_t> ids;
};

// A dispatch in flight (see ExpertClient::Start).
class PendingDispatch {
 public:
  virtual ~PendingDispatch() = default;
  // Blocks until the result is in `out`; returns its status. Call once.
  virtual absl::Status Wait() = 0;
};

class ExpertClient {
 public:
  virtual ~ExpertClient() = default;
  // out[num_tokens, hidden] = Σ_k topk_weights[t, k] · Expert_{topk_ids[t, k]}(h_t),
  // overwriting out. Thread-safety is the implementation's to state.
  virtual absl::Status Run(const MoeDispatch& dispatch, float* out) = 0;
  // Like Run, but may return before the experts finish so the caller can
  // compute meanwhile (ping-pong micro-batching, the shared expert). The
  // dispatch's buffers and `out` must stay valid until Wait returns. The
  // default runs synchronously.
  virtual std::unique_ptr<PendingDispatch> Start(const MoeDispatch& dispatch, float* out);
  // True iff Start overlaps (so splitting a batch pays off).
  virtual bool IsAsync() const { return false; }

  // Device-resident dispatch: >= 0 iff RunOnDevice takes buffers in that
  // CUDA device's memory (a transport mapping GPU memory: cuda_ipc).
  virtual int dispatch_device() const { return -1; }
  // out (device, fp32 [num_tokens, hidden]) = the routed experts' weighted
  // sum, overwritten: complete once dispatch.ready has fired and, on return,
  // delivered on dispatch.stream (see DeviceMoeDispatch). UNIMPLEMENTED
  // unless dispatch_device() >= 0.
  virtual absl::Status RunOnDevice(const DeviceMoeDispatch& dispatch, float* out);
  // Call once the caller's stream is done with every result RunOnDevice
  // delivered since the last call: OK if they are all sound; UNAVAILABLE if
  // a worker failed meanwhile (it is routed around from now on; the results
  // are not to be used, the step is to be run again). Transports that
  // answer within RunOnDevice (cuda_ipc) always return OK.
  virtual absl::Status CheckDeviceDispatches() { return absl::OkStatus(); }
};

// The expert FFNs of one shard: for every MoE layer, a grouped computation over
// the tokens routed to the shard's experts. Thread-safe (read-only weights).
// Experts can be added while serving (AddShard: replicas placed by the
// rebalancer); a dispatch already running uses the experts it started with.
//
// This class computes on the CPU in fp32; common/cuda_backend's
// CudaExpertStage overrides Accumulate and AddShard to compute on a GPU
// (bf16 weights), keeping this class's bookkeeping of what is hosted.
class ExpertStage {
 public:
  ExpertStage(const ModelConfig& config, std::unique_ptr<ExpertShardWeights> weights);
  virtual ~ExpertStage() = default;

  // Adds into out[num_tokens, hidden] the weighted outputs of the (token,
  // expert) pairs whose expert is in this shard; other pairs are skipped.
  // INVALID_ARGUMENT for a dense layer, a wrong hidden size or an expert id
  // beyond n_routed_experts.
  virtual absl::Status Accumulate(const MoeDispatch& dispatch, float* out) const;

  // OK, or an error (e.g. the device lacks memory) leaving the stage as it was.
  virtual absl::Status AddShard(std::unique_ptr<ExpertShardWeights> more);
  // Stops hosting `ids` (replicas the placement no longer routes to) and
  // frees their weights once no running dispatch uses them. INVALID_ARGUMENT
  // (and the stage as it was) if that would leave no expert. Not
  // concurrently with AddShard (ExpertService serialises them).
  virtual absl::Status RemoveExperts(const std::set<int>& ids);
  // Device-resident (CudaExpertStage): out (device, fp32 [num_tokens,
  // hidden]) = the weighted outputs of the hosted (and served) pairs,
  // overwritten; returns once the device is done, or with dispatch.done once
  // the work is enqueued. `counted`, if not null, gets the dispatches whose
  // pairs are now known on the host: this one when it waited; an earlier one
  // that did not wait, once it is done. UNIMPLEMENTED here.
  virtual absl::Status AccumulateOnDevice(const DeviceMoeDispatch& dispatch, float* out,
                                          std::vector<CountedDispatch>* counted) const;
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
  // REQUIRES: stage holds every routed expert.
  explicit LocalExpertClient(std::unique_ptr<ExpertStage> stage) : stage_(std::move(stage)) {}
  absl::Status Run(const MoeDispatch& dispatch, float* out) override;

 private:
  const std::unique_ptr<ExpertStage> stage_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_EXPERT_CLIENT_H_
