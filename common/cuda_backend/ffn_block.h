// The feed-forward half of every DeepSeek layer on the GPU, shared by the
// families' layer stacks: the dense (or shared-expert) SwiGLU MLP, and the
// MoE — fp32 router GEMM, gate/top-k, then the routed experts on this device
// (permute, grouped GEMMs, weighted combine) or behind an ExpertClient
// (device-resident dispatch, or a round trip through the host), the shared
// expert running meanwhile (with the experts on this device and at decode
// sizes, on a second stream: CudaModelOptions::shared_expert_stream).
// Outputs accumulate into the caller's fp32 residual rows [T, hidden].
//
// Not thread-safe: its model's caller's thread, on the context's stream.
#ifndef MOESH_COMMON_CUDA_BACKEND_FFN_BLOCK_H_
#define MOESH_COMMON_CUDA_BACKEND_FFN_BLOCK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda_backend/forward_context.h"
#include "common/model/expert_client.h"
#include "kernels/cuda/device.h"

namespace moesh::cuda {

class FfnBlock {
 public:
  // Scratch for ctx.max_tokens rows. REQUIRES: ctx's config, options,
  // weights, stream, gemm and graphs set.
  static absl::StatusOr<std::unique_ptr<FfnBlock>> Create(const ForwardContext& ctx);
  FfnBlock(const FfnBlock&) = delete;
  FfnBlock& operator=(const FfnBlock&) = delete;

  // A pass of `num_tokens` rows begins; its first `dispatched` rows (a
  // decode batch's rows before the padding) go to external experts.
  void BeginPass(int num_tokens, int dispatched) {
    pass_tokens_ = num_tokens;
    dispatched_ = dispatched;
  }
  // out[T, hidden] += down(SiLU(gate) · up) of normed [T, hidden] (bf16), on
  // `on` (null: the context's stream; another only where both linears are
  // ForwardContext::OnFp8Gemv).
  absl::Status EnqueueMlp(const DeviceLinear& w_gate_up, const DeviceLinear& w_down, int inter,
                          int num_tokens, const bf16* normed, float* out,
                          cudaStream_t on = nullptr);
  // out += MoE layer `layer` of `normed` (bf16 [T, hidden]; its fp32 copy
  // normed_f32 feeds the router). `experts` null: the experts on this device.
  // The shared expert's MLP is included.
  absl::Status EnqueueMoe(int layer, int num_tokens, const bf16* normed, const float* normed_f32,
                          float* out, ExpertClient* experts);
  // A piecewise graph's replay: MoE layer `layer`'s device-resident dispatch
  // of `num_tokens` rows, between the captured segments (the inputs at the
  // addresses the capture used).
  absl::Status LaunchDeviceDispatch(int layer, int num_tokens, ExpertClient* experts);

  // Tokens each routed expert received in the last pass, [layers, experts].
  absl::StatusOr<std::vector<int32_t>> ExpertCounts();
  // With options.record_routing: [layers, *rows, top_k] (-1 for dense layers).
  absl::StatusOr<std::vector<int32_t>> Routing(int* rows);

 private:
  explicit FfnBlock(const ForwardContext& ctx) : ctx_(ctx) {}
  absl::Status Init();
  // Hands MoE layer `layer`'s first `num_tokens` rows (`normed`, bf16 on this
  // device), the top-k ids and weights to `experts` device-resident: started
  // once dispatch_copied_ fires, the sum delivered into moe_out_ on the
  // context's stream.
  absl::Status RunDeviceDispatch(int layer, int num_tokens, const bf16* normed,
                                 ExpertClient* experts);
  // The routed part of EnqueueMoe through `experts`.
  absl::Status RunExternalExperts(int layer, int num_tokens, const bf16* normed,
                                  const float* normed_f32, float* out, ExpertClient* experts);

  const ForwardContext& ctx_;
  int pass_tokens_ = 0, dispatched_ = 0;
  const bf16* dispatch_input_ = nullptr;  // the MoE input the last pass dispatched
  DeviceBuffer<float> router_logits_, topk_w_, moe_out_;
  DeviceBuffer<bf16> mlp_gu_, mlp_act_, moe_gu_, moe_act_;
  DeviceBuffer<bf16> moe_gathered_;  // the dense expert path's gathered rows (null: never taken)
  // The experts' FP8 activations (CudaModelOptions::fp8_expert_act; else null).
  DeviceBuffer<uint8_t> moe_act_fp8_;
  DeviceBuffer<float> moe_act_fp8_scale_;
  DeviceBuffer<int32_t> topk_ids_, row_token_, pair_row_, expert_offsets_, tile_offsets_,
      expert_counts_;
  PinnedBuffer<int32_t> h_expert_offsets_;
  // External experts: the dispatch staged on the host, the result back.
  PinnedBuffer<float> h_hidden_, h_topk_w_, h_routed_;
  PinnedBuffer<int32_t> h_topk_ids_;
  Event dispatch_copied_;
  // CudaModelOptions::shared_expert_stream: the shared experts' stream.
  ForkedStream shared_stream_;
  DeviceBuffer<int32_t> routing_log_;  // [layers, max_tokens, top_k] iff record_routing
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_FFN_BLOCK_H_
