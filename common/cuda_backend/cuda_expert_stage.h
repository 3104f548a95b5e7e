// CudaExpertStage: an expert worker's shard of routed experts on one GPU.
//
// Per MoE layer the hosted experts are stacked in bf16 ([E_local, 2 * inter,
// hidden] and [E_local, hidden, inter]); a dispatch runs the same kernels as
// CudaModel's MoE block: the (token, k) pairs of hosted experts are sorted by
// expert (pairs routed elsewhere are skipped), a grouped gate_up GEMM,
// SiLU·mul, a grouped down GEMM in fp32, and the weighted combine, which is
// added into the caller's host buffer. Hidden states arrive in fp32 and are
// rounded to bf16 (weights and activations in bf16, accumulation in fp32, as
// the CUDA model computes them). A dispatch in device memory (the cuda_ipc
// and nccl transports) comes in bf16 and its result is written there.
//
// Thread-safe: dispatches of one lane (MoeDispatch::lane: a transport's
// attachment) run one at a time on that lane's stream, different lanes'
// side by side; AddShard uploads the new experts and swaps the stacks in
// between dispatches.
#ifndef MOESH_COMMON_CUDA_BACKEND_CUDA_EXPERT_STAGE_H_
#define MOESH_COMMON_CUDA_BACKEND_CUDA_EXPERT_STAGE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda_backend/device_weights.h"
#include "common/model/expert_client.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/expert_mlp.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

class CudaExpertStage : public ExpertStage {
 public:
  // Uploads the shard to the current device in RoutedExpertFormat(config,
  // fp8) (device_weights.h): FP8 (`fp8`: block-scaled, quantized there, or an
  // FP8 checkpoint's codes copied as they are), DeepSeek-V4's MXFP4 (its
  // checkpoint's codes back, exactly), or bf16. A Deferred shard is read from
  // its checkpoint expert by expert (no float32 copy of the shard on the
  // host); AddShard's too, and experts already here are copied on the device.
  // RESOURCE_EXHAUSTED if it does not fit; UNIMPLEMENTED for shapes the
  // grouped GEMM is not built for.
  static absl::StatusOr<std::unique_ptr<CudaExpertStage>> Create(
      const ModelConfig& config, std::unique_ptr<ExpertShardWeights> weights, bool fp8 = false);
  ~CudaExpertStage() override;

  // Host dispatches are staged through this GPU; device dispatches are read
  // where they lie (another process's memory mapped through CUDA IPC, or
  // this GPU's), their expert ids mapped to the stacks on the device, and
  // `out` written on the device: no host staging.
  absl::Status Accumulate(const MoeDispatch& dispatch, float* out,
                          std::vector<CountedDispatch>* counted = nullptr) const override;
  // Host f32, and bf16 in this stage's device memory.
  MemoryKinds memory_kinds() const override { return {ordinal_}; }
  absl::Status AddShard(std::unique_ptr<ExpertShardWeights> more) override;
  // Rebuilds the stacks without `ids`; a running dispatch keeps the old ones.
  absl::Status RemoveExperts(const std::set<int>& ids) override;
  std::string device() const override { return device_; }
  // Bytes of expert weights on the device.
  size_t device_bytes() const;
  // Whether FP8 experts take FP8 activations at kFp8ActivationTileRows-row
  // tiles (kernels/cuda/expert_mlp.h), as the colocated engine's do by
  // default (CudaModelOptions::fp8_expert_act): FP8 weights at DeepSeek's
  // widths (whole 128-column blocks).
  bool fp8_activations() const {
    return format_ == LinearFormat::kFp8 &&
           Fp8ActivationWidths(config().hidden_size, config().moe_intermediate_size);
  }

 private:
  // One MoE layer's hosted experts, stacked.
  struct ExpertLayer {
    DeviceBuffer<uint8_t> gate_up_bytes, down_bytes;    // bf16, e4m3 or e2m1 pairs
    DeviceBuffer<uint8_t> gate_up_scales, down_scales;  // FP8 (float32) or MXFP4 (ue8m0)
    DeviceLinear gate_up, down;                         // views of the above
  };
  // Everything a dispatch reads; replaced whole by AddShard.
  struct Stacks {
    std::vector<int32_t> local;  // global expert id -> row in the stacks, or -1
    int num_local = 0;
    std::map<int, ExpertLayer> layers;
    size_t bytes = 0;
  };
  // Scratch for one dispatch, grown on demand.
  struct Scratch {
    DeviceBuffer<bf16> x, gu, act, gathered;
    DeviceBuffer<float> y, out, weights;
    DeviceBuffer<int32_t> ids, expert_offsets, tile_offsets, row_token, pair_row, map;
    // FP8 experts at 64-row tiles: the inputs' and SiLU outputs' e4m3 codes
    // and scales (ExpertMlpParams::act_fp8; as CudaModel's FfnBlock).
    DeviceBuffer<uint8_t> act_fp8;
    DeviceBuffer<float> act_fp8_scale;
    PinnedBuffer<uint16_t> h_x;
    PinnedBuffer<float> h_w, h_out;
    PinnedBuffer<int32_t> h_ids, h_map, h_offsets;
    std::unique_ptr<CublasGemm> gemm;  // the dense expert path's (expert_mlp.h)
  };

  CudaExpertStage(const ModelConfig& config, std::unique_ptr<ExpertShardWeights> weights,
                  Stream stream, int ordinal, bool fp8)
      : ExpertStage(config, std::move(weights)),
        stream_(std::move(stream)),
        format_(RoutedExpertFormat(config, fp8)),
        ordinal_(ordinal),
        device_("cuda:" + std::to_string(ordinal)) {}
  // Accumulate's two memory kinds.
  absl::Status AccumulateHost(const MoeDispatch& dispatch, float* out) const;
  absl::Status AccumulateDevice(const MoeDispatch& dispatch, float* out,
                                std::vector<CountedDispatch>* counted) const;
  // Stacks for every expert in `shards` (the first shard holding an expert
  // serves it): an expert `old` holds is copied on the device; else read
  // from its shard's checkpoint (Deferred), made (placeholder) or uploaded.
  absl::StatusOr<std::shared_ptr<const Stacks>> Build(
      const std::vector<const ExpertShardWeights*>& shards, const Stacks* old) const;
  std::shared_ptr<const Stacks> current_stacks() const;

  // A caller's lane (MoeDispatch::lane): its own stream, scratch and
  // returned-early dispatch. Dispatches of one lane run in order; different
  // lanes' overlap on the device, so one caller's work — or its `ready`
  // that never fires — holds up only its own lane, not another client's
  // (a prefill worker's dispatches beside a decode worker's).
  struct Lane {
    absl::Mutex mu;  // one dispatch of this lane on the host at a time
    Stream stream;
    Scratch scratch ABSL_GUARDED_BY(mu);
    int scratch_tokens ABSL_GUARDED_BY(mu) = 0;
    int scratch_top_k ABSL_GUARDED_BY(mu) = 0;
    int scratch_local ABSL_GUARDED_BY(mu) = 0;
    // What scratch.map holds (empty: unknown), so an unchanged expert map is
    // not uploaded again: a copy on the stream between every layer's kernels.
    std::vector<int32_t> uploaded_map ABSL_GUARDED_BY(mu);
    // A device dispatch that returned before the device finished (MoeDispatch::
    // done): its ids land in pending_ids once pending_event fires; the lane's
    // next call waits for that, so host buffers are never rewritten under a copy.
    bool pending ABSL_GUARDED_BY(mu) = false;
    CountedDispatch pending_counted ABSL_GUARDED_BY(mu);
    std::vector<uint8_t> pending_serve ABSL_GUARDED_BY(mu);
    PinnedBuffer<int32_t> pending_ids ABSL_GUARDED_BY(mu);
    Event pending_event ABSL_GUARDED_BY(mu);
    // Such a dispatch's ids come back on their own stream, forked when its
    // inputs are ready and joined before `done`, so the copy is off the path
    // the caller waits on.
    ForkedStream ids_stream ABSL_GUARDED_BY(mu);
  };
  // Lanes beyond this share (lane mod kMaxLanes): each holds scratch for the
  // largest dispatch it has seen.
  static constexpr int kMaxLanes = 8;
  // The lane for MoeDispatch::lane, made on first use.
  absl::StatusOr<Lane*> LaneFor(int lane) const;

  absl::Status EnsureScratch(Lane& lane, int num_tokens, int top_k, int num_local) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  // Waits for the lane's dispatch that returned early; hands its pairs to
  // `counted` (dropped if null).
  absl::Status DrainPending(Lane& lane, std::vector<CountedDispatch>* counted) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);
  // ids of pairs not in `serve` (empty: every pair) become -1.
  void CountOnlyServed(const std::vector<uint8_t>& serve, std::vector<int32_t>* ids) const;
  // One grouped pass over the shard's experts, on the lane's stream: the
  // pairs sorted by expert (ids mapped through `map` when it is set), gate_up
  // GEMM, SiLU·mul, down GEMM, and the weighted combine written into `out`
  // (every row: a token none of whose pairs land here gets zeros).
  struct ExpertPass {
    const bf16* x = nullptr;       // [num_tokens, hidden]
    const int32_t* ids = nullptr;  // [num_tokens, top_k]: stack rows, or global ids with `map`
    const int32_t* map = nullptr;  // [map_size] global id -> stack row or -1; may be null
    int map_size = 0;
    const float* weights = nullptr;  // [num_tokens, top_k]
    float* out = nullptr;            // [num_tokens, hidden], overwritten
    int num_tokens = 0, top_k = 0;
    int max_rows = 0;       // a bound on the pairs that land here (sizes the launches)
    int expected_rows = 0;  // the pairs expected here, and
    int served = 0;         // the experts they spread over (pick the tile height)
  };
  absl::Status EnqueueExperts(Lane& lane, const ExpertLayer& ls, int num_local,
                              const ExpertPass& pass) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mu);

  const Stream stream_;  // building stacks (Create, AddShard)
  const LinearFormat format_;
  const int ordinal_;  // made current on each calling thread
  const std::string device_;
  std::vector<const ExpertShardWeights*> hosted_;  // guarded by add_mu_
  mutable absl::Mutex add_mu_;                     // serialises AddShard
  // The stacks now (a dispatch keeps them while it runs; AddShard swaps them).
  std::shared_ptr<const Stacks> Snapshot() const;

  mutable absl::Mutex stacks_mu_;
  std::shared_ptr<const Stacks> stacks_ ABSL_GUARDED_BY(stacks_mu_);
  mutable absl::Mutex lanes_mu_;
  mutable std::unique_ptr<Lane> lanes_[kMaxLanes] ABSL_GUARDED_BY(lanes_mu_);
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_CUDA_EXPERT_STAGE_H_
