// A DeepSeek V2/V3 model's weights on the device, bf16 (the router in fp32),
// in one cudaMalloc arena, laid out for the CUDA forward pass:
//   * q_a (or q_proj) and kv_a_proj_with_mqa stacked into one GEMM;
//   * kv_b_proj split into W_UK^T per head (absorbed into the query) and
//     W_UV per head (applied to the attention output);
//   * each MoE layer's routed experts stacked [E, ...] for the grouped GEMM.
// Filled from a checkpoint's host weights (fp32, rounded to bf16 here) or with
// random values generated on the device (--load-format dummy).
#ifndef MOESH_KERNELS_CUDA_MODEL_DEVICE_WEIGHTS_H_
#define MOESH_KERNELS_CUDA_MODEL_DEVICE_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/weights.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

// dst[0, n) = bf16(src[0, n)) (common/dtype.h's F32ToBf16) through *staging,
// synchronously.
absl::Status UploadBf16(bf16* dst, const float* src, size_t n, std::vector<uint16_t>* staging);

struct DeviceLayerWeights {
  bf16* input_norm = nullptr;  // [hidden]
  bf16* post_norm = nullptr;   // [hidden]
  // [q_width + kv_lora_rank + rope, hidden]: q_a_proj (q_width = q_lora_rank)
  // or q_proj (q_width = heads * qk_head_dim), then kv_a_proj_with_mqa.
  bf16* qkv_a = nullptr;
  bf16* q_a_norm = nullptr;   // [q_lora_rank]; iff q_lora_rank > 0
  bf16* q_b = nullptr;        // [heads * qk_head_dim, q_lora_rank]; iff q_lora_rank > 0
  bf16* kv_a_norm = nullptr;  // [kv_lora_rank]
  bf16* w_uk_t = nullptr;     // [heads, kv_lora_rank, qk_nope_head_dim]
  bf16* w_uv = nullptr;       // [heads, v_head_dim, kv_lora_rank]
  bf16* o_proj = nullptr;     // [hidden, heads * v_head_dim]
  bool is_moe = false;
  bf16* dense_gate_up = nullptr;  // [2 * intermediate, hidden]; iff !is_moe
  bf16* dense_down = nullptr;     // [hidden, intermediate]
  float* router = nullptr;        // [n_routed_experts, hidden]; iff is_moe
  float* router_bias = nullptr;   // [n_routed_experts]; may be null
  bf16* shared_gate_up = nullptr;  // [2 * shared_intermediate, hidden]; null iff no shared experts
  bf16* shared_down = nullptr;     // [hidden, shared_intermediate]
  bf16* experts_gate_up = nullptr;  // [E, 2 * moe_intermediate, hidden]; null without routed experts
  bf16* experts_down = nullptr;     // [E, hidden, moe_intermediate]
};

class DeviceWeights {
 public:
  // REQUIRES: config validated, family V2 or V3 (UNIMPLEMENTED otherwise).
  // `experts` null: no routed experts on the device (they run elsewhere,
  // behind an ExpertClient); else it must hold every routed expert.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> FromHost(const ModelConfig& config,
                                                                  const AttentionWeights& attention,
                                                                  const ExpertShardWeights* experts);
  // Uniform random values from `seed`, generated on the device: linear
  // weights in ±1/sqrt(fan_in), norms in 1 ± 0.05.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Dummy(const ModelConfig& config, uint64_t seed,
                                                              cudaStream_t stream, bool routed_experts = true);

  bool has_routed_experts() const { return routed_experts_; }

  int q_width() const { return q_width_; }
  int shared_intermediate() const { return shared_intermediate_; }
  const DeviceLayerWeights& layer(int l) const { return layers_[l]; }
  const bf16* embed() const { return embed_; }    // [vocab, hidden]
  const bf16* norm() const { return norm_; }      // [hidden]
  const bf16* lm_head() const { return lm_head_; }  // [vocab, hidden]; == embed() iff tied
  size_t bytes() const { return arena_.bytes(); }

  // Bytes of weights a decode step reads when `experts_touched` routed experts
  // (summed over the MoE layers) receive tokens and `tokens` rows of the
  // embedding are gathered: every non-expert weight once, the touched experts
  // once each, the embedding rows only.
  double StepWeightBytes(int64_t experts_touched, int tokens) const;

 private:
  struct Slot;
  DeviceWeights() = default;
  // Lays out every tensor of `config`; `slots` gets their pointers and sizes.
  absl::Status Allocate(const ModelConfig& config, std::vector<Slot>* slots);

  ModelConfig config_;
  bool routed_experts_ = true;
  int q_width_ = 0;
  int shared_intermediate_ = 0;
  DeviceBuffer<uint8_t> arena_;
  std::vector<DeviceLayerWeights> layers_;
  bf16* embed_ = nullptr;
  bf16* norm_ = nullptr;
  bf16* lm_head_ = nullptr;
  // For StepWeightBytes.
  double dense_bytes_ = 0;       // every tensor but the embedding and the routed experts
  double expert_bytes_ = 0;      // one routed expert of one layer
  double embed_row_bytes_ = 0;
};

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_MODEL_DEVICE_WEIGHTS_H_
