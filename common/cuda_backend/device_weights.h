// A DeepSeek V2/V3/V3.2/V4 model's weights on the device, bf16 (the router in fp32),
// in one cudaMalloc arena, laid out for the CUDA forward pass:
//   * the linears (DeviceLinear: attention projections, dense and shared
//     MLPs, the routed expert stacks) in bf16, or with `fp8_linears` in
//     DeepSeek's block-scaled FP8 (e4m3, a float32 scale per 128 x 128 block,
//     quantized on the device at load: --quantization fp8, FP8 checkpoints);
//   * q_a (or q_proj) and kv_a_proj_with_mqa stacked into one GEMM (in FP8
//     each part starts at a multiple of 128 rows, so its blocks are its own);
//   * kv_b_proj split into W_UK^T per head (absorbed into the query) and
//     W_UV per head (applied to the attention output);
//   * each MoE layer's routed experts stacked [E, ...] for the grouped GEMM.
// Filled from a checkpoint's host weights (fp32, rounded to bf16 here) or with
// random values generated on the device (--load_format dummy).
#ifndef MOESH_COMMON_CUDA_BACKEND_DEVICE_WEIGHTS_H_
#define MOESH_COMMON_CUDA_BACKEND_DEVICE_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "common/model/weights.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/expert_mlp.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

// How a linear's weight is held on the device.
enum class LinearFormat {
  kBf16,
  kFp8,    // e4m3 codes, a float32 scale per 128 x 128 block
  kMxfp4,  // e2m1 pairs, a ue8m0 scale per 32 inputs (routed experts only)
};

// A linear layer's weight, nn.Linear's [n, k]: bf16; e4m3 codes with scales
// laid out as kernels/cuda/params.h's Fp8GemmParams::w_scale; or MXFP4 as
// GroupedGemmParams::w_fp4 holds it (a routed expert stack's).
struct DeviceLinear {
  void* w = nullptr;            // bf16 or e4m3 [n, k]; e2m1 pairs [n, k / 2]
  float* scale = nullptr;       // FP8: [Fp8Blocks(n), Fp8ScaleStride(k)]
  uint8_t* mx_scale = nullptr;  // MXFP4: ue8m0 [n, k / 32]
  bool fp8() const { return scale != nullptr; }
  bool mxfp4() const { return mx_scale != nullptr; }
  LinearFormat format() const {
    return fp8() ? LinearFormat::kFp8 : (mxfp4() ? LinearFormat::kMxfp4 : LinearFormat::kBf16);
  }
};

// The routed experts' format on the device: DeepSeek-V4's MXFP4 as its
// checkpoint ships them (config.mxfp4_experts); FP8 with `fp8_linears` for
// the other families; else bf16 (V4's FP8 experts too: its ue8m0-scaled codes
// are exact in bf16, not in DeepSeek-V3's float-scaled FP8 blocks).
LinearFormat RoutedExpertFormat(const ModelConfig& config, bool fp8_linears);
// Bytes of a [n, k] linear's weight and of its scales in `format`.
size_t LinearWeightBytes(LinearFormat format, int64_t n, int64_t k);
size_t LinearScaleBytes(LinearFormat format, int64_t n, int64_t k);
// The grouped GEMM's view of a routed expert stack pair, per their format.
void SetExpertWeights(const DeviceLinear& gate_up, const DeviceLinear& down, ExpertMlpParams* p);

// Entry `i` of a stack of [n, k] linears (routed experts).
DeviceLinear LinearSlice(const DeviceLinear& stack, int64_t i, int64_t n, int64_t k);
// dst = src [n, k] (fp32 on the host) as dst's format holds it, synchronously:
// rounded to bf16 through *staging, quantized on the device (FP8) through
// *f32_scratch (grown as needed), or quantized on the host (MXFP4: exact for
// values an MXFP4 checkpoint dequantized to, so its own codes come back).
absl::Status UploadLinear(const DeviceLinear& dst, const float* src, int64_t n, int64_t k,
                          std::vector<uint16_t>* staging, DeviceBuffer<float>* f32_scratch);
// One routed expert's linears as its checkpoint stores them (m's FP8 views
// released) into its slices of the stacks: gate_up [2 * intermediate,
// hidden] (gate rows first) and down [hidden, intermediate]. An FP8
// checkpoint's codes and block scales are copied as they are into FP8 stacks
// (gate and up each on their own 128-row blocks: intermediate a multiple of
// 128); anything else goes through float32 as UploadLinear does (bf16 rounded,
// or quantized on the device). Synchronous.
absl::Status UploadStoredMlp(const Checkpoint& ckpt, StoredMlp* m, const DeviceLinear& gate_up,
                             const DeviceLinear& down, int64_t hidden,
                             std::vector<uint16_t>* staging, DeviceBuffer<float>* f32_scratch);
// dst = src, both [n, k] in the same format (FP8: with the scales), device to
// device on `stream`.
absl::Status CopyLinear(const DeviceLinear& dst, const DeviceLinear& src, int64_t n, int64_t k,
                        cudaStream_t stream);
// dst = uniform random values in ±scale from `seed` (FillUniform), as dst's
// format holds them (FP8, MXFP4: quantized from bf16 ones made in
// *bf16_scratch).
absl::Status FillLinear(const DeviceLinear& dst, int64_t n, int64_t k, uint64_t seed, float scale,
                        cudaStream_t stream, DeviceBuffer<bf16>* bf16_scratch);

// dst[0, n) = bf16(src[0, n)) (base/dtype.h's F32ToBf16) through *staging,
// synchronously.
absl::Status UploadBf16(bf16* dst, const float* src, size_t n, std::vector<uint16_t>* staging);
// dst[0, n) = src (fp32 or int32), synchronously.
absl::Status UploadWords(void* dst, const void* src, size_t n);
// INVALID_ARGUMENT naming `what` unless v.size() == n.
absl::Status CheckSize(const std::vector<float>& v, size_t n, const std::string& what);

struct DeviceLayerWeights {
  bf16* input_norm = nullptr;  // [hidden]
  bf16* post_norm = nullptr;   // [hidden]
  // [qkv_width, hidden]: q_a_proj (q_width = q_lora_rank) or q_proj
  // (q_width = heads * qk_head_dim), then from row kv_col kv_a_proj_with_mqa
  // (kv_lora_rank + rope), then for V3.2 from index_col the indexer's wk
  // (index_head_dim) and from index_weights_col its weights_proj
  // (index_n_heads); rows between the parts (FP8 only) are zero.
  DeviceLinear qkv_a;
  bf16* q_a_norm = nullptr;   // [q_lora_rank]; iff q_lora_rank > 0
  DeviceLinear q_b;           // [heads * qk_head_dim, q_lora_rank]; iff q_lora_rank > 0
  bf16* kv_a_norm = nullptr;  // [kv_lora_rank]
  bf16* w_uk_t = nullptr;     // [heads, kv_lora_rank, qk_nope_head_dim]
  bf16* w_uv = nullptr;       // [heads, v_head_dim, kv_lora_rank]
  DeviceLinear o_proj;        // [hidden, heads * v_head_dim]
  bool is_moe = false;
  DeviceLinear dense_gate_up;    // [2 * intermediate, hidden]; iff !is_moe
  DeviceLinear dense_down;       // [hidden, intermediate]
  float* router = nullptr;       // [n_routed_experts, hidden]; iff is_moe
  float* router_bias = nullptr;  // [n_routed_experts]; may be null
  DeviceLinear shared_gate_up;   // [2 * shared_intermediate, hidden]; w null iff no shared experts
  DeviceLinear shared_down;      // [hidden, shared_intermediate]
  // [E, 2 * moe_intermediate, hidden]; w null without routed experts. In
  // FP8 the scales are [E, Fp8Blocks(n), Fp8ScaleStride(k)] (each expert's
  // blocks its own; the grouped GEMM widens the codes to bf16).
  DeviceLinear experts_gate_up;
  DeviceLinear experts_down;  // [E, hidden, moe_intermediate]
  // The lightning indexer's query projection (DeepSeek-V3.2; V4's CSA
  // layers). V3.2's key projection and head weights are qkv_a's last
  // index_head_dim + index_n_heads rows, its key LayerNorm here (fp32).
  bf16* index_wq_b = nullptr;     // [index_n_heads * index_head_dim, q_lora_rank]
  float* index_k_norm = nullptr;  // [index_head_dim]; V3.2
  float* index_k_bias = nullptr;  // [index_head_dim]; V3.2
  // DeepSeek-V4 (of the above only the norms, router, router_bias, shared_*
  // and experts_* are used; the router bias is null on hash-routed layers).
  struct V4 {
    float* hc_attn_fn = nullptr;  // [(2 + hc) * hc, hc * hidden]
    float* hc_attn_base = nullptr;
    float* hc_attn_scale = nullptr;  // [3]
    float* hc_ffn_fn = nullptr;
    float* hc_ffn_base = nullptr;
    float* hc_ffn_scale = nullptr;
    // [a_width, hidden]: wq_a (q_lora_rank rows), then the cache row's
    // projections (row_width: wkv, compressor wkv and wgate, index compressor
    // wkv and wgate), then index_weights_proj (CSA layers).
    bf16* a = nullptr;
    int a_width = 0, row_width = 0;
    bf16* q_norm = nullptr;      // [q_lora_rank]
    bf16* wq_b = nullptr;        // [heads * head_dim, q_lora_rank]
    bf16* kv_norm = nullptr;     // [head_dim]
    bf16* wo_a = nullptr;        // [o_groups * o_lora_rank, heads * head_dim / o_groups]
    bf16* wo_b = nullptr;        // [hidden, o_groups * o_lora_rank]
    float* sinks = nullptr;      // [heads]
    float* comp_ape = nullptr;   // [rate, series * head_dim]; CSA and HCA layers
    bf16* comp_norm = nullptr;   // [head_dim]
    float* index_ape = nullptr;  // [rate, 2 * index_head_dim]; CSA layers
    bf16* index_norm = nullptr;  // [index_head_dim]
    int32_t* tid2eid = nullptr;  // [vocab, top_k]; hash-routed layers
  } v4;
};

class DeviceWeights {
 public:
  // REQUIRES: config validated.
  // `experts` null: no routed experts on the device (they run elsewhere,
  // behind an ExpertClient); else it must hold every routed expert.
  // `fp8_linears`: the DeviceLinears in block-scaled FP8, quantized from the
  // host's values (an FP8 checkpoint's dequantized ones give its own codes
  // back); INVALID_ARGUMENT where a linear's input width is not a multiple
  // of 16. DeepSeek-V4: its FP8 checkpoint's linears are held in bf16 (e4m3
  // times a power of two is exact there), its MXFP4 routed experts as MXFP4
  // (RoutedExpertFormat); `fp8_linears` on a bf16 V4 checkpoint is
  // UNIMPLEMENTED.
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> FromHost(const ModelConfig& config,
                                                                 const AttentionWeights& attention,
                                                                 const ExpertShardWeights* experts,
                                                                 bool fp8_linears = false);
  // The same from the checkpoint itself, streamed: one layer's float32
  // weights on the host at a time, each routed expert read as stored (FP8
  // codes copied as they are, UploadStoredMlp), so the host holds about one
  // layer's attention weights, not the model. REQUIRES: ValidateCheckpoint.
  // DeepSeek-V4 goes through FromHost (its weights are bf16 on the device).
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> FromCheckpoint(const ModelConfig& config,
                                                                       const Checkpoint& ckpt,
                                                                       bool routed_experts,
                                                                       bool fp8_linears = false);
  // Uniform random values from `seed`, generated on the device: linear
  // weights in ±1/sqrt(fan_in), norms in 1 ± 0.05 (FP8 linears quantized
  // from such bf16 values).
  static absl::StatusOr<std::unique_ptr<DeviceWeights>> Dummy(const ModelConfig& config,
                                                              uint64_t seed, cudaStream_t stream,
                                                              bool routed_experts = true,
                                                              bool fp8_linears = false);

  bool has_routed_experts() const { return routed_experts_; }

  int q_width() const { return q_width_; }
  int qkv_width() const { return qkv_width_; }
  // Where qkv_a's parts start (rows of the weight, columns of its output).
  int kv_col() const { return kv_col_; }
  int index_col() const { return index_col_; }
  int index_weights_col() const { return index_weights_col_; }
  bool fp8_linears() const { return fp8_linears_; }
  // The widest input (k) and output (n) of the FP8 dense linears, the ones
  // ForwardContext::Gemm runs (0 without).
  int max_fp8_k() const { return max_fp8_k_; }
  int max_fp8_n() const { return max_fp8_n_; }
  int shared_intermediate() const { return shared_intermediate_; }
  const DeviceLayerWeights& layer(int l) const { return layers_[l]; }
  const bf16* embed() const { return embed_; }      // [vocab, hidden]
  const bf16* norm() const { return norm_; }        // [hidden]
  const bf16* lm_head() const { return lm_head_; }  // [vocab, hidden]; == embed() iff tied
  // DeepSeek-V4's final hc head: fn [hc, hc * hidden], base [hc], scale [1].
  const float* hc_head_fn() const { return hc_head_fn_; }
  const float* hc_head_base() const { return hc_head_base_; }
  const float* hc_head_scale() const { return hc_head_scale_; }
  size_t bytes() const { return arena_.bytes(); }

  // Bytes of weights a decode step reads when `experts_touched` routed experts
  // (summed over the MoE layers) receive tokens and `tokens` rows of the
  // embedding are gathered: every non-expert weight once, the touched experts
  // once each, the embedding rows only.
  double StepWeightBytes(int64_t experts_touched, int tokens) const;

 private:
  // One tensor of the arena: where its pointer goes, and how Dummy fills it.
  struct Slot {
    enum class Kind { kOther, kEmbed, kExpert, kExpertTable, kLinear };
    void** target = nullptr;
    size_t count = 0;
    bool f32 = false;  // 4-byte elements (fp32; int32 for kExpertTable)
    float scale = 0.0f, offset = 0.0f;
    Kind kind = Kind::kOther;
    // kLinear, kExpert: the weight's shape (batch of them); in FP8, codes and
    // scales (scale_target).
    int64_t n = 0, k = 0, batch = 1;
    LinearFormat format = LinearFormat::kBf16;
    float** scale_target = nullptr;       // FP8
    uint8_t** mx_scale_target = nullptr;  // MXFP4
    size_t Bytes() const;                 // the codes' or values' bytes (the scales' apart)
    size_t ScaleBytes() const;
  };
  // A DeviceLinear [batch, n, k] (FP8 iff fp8_linears_; a routed expert
  // stack, kind kExpert, in expert_format_), Dummy's values in ±scale.
  void AddLinear(std::vector<Slot>* slots, DeviceLinear* target, int64_t n, int64_t k, float scale,
                 int64_t batch = 1, Slot::Kind kind = Slot::Kind::kLinear);
  // UploadLinear through upload_f32_.
  absl::Status UploadLinear(const DeviceLinear& dst, const float* src, int64_t n, int64_t k,
                            std::vector<uint16_t>* staging) {
    return ::moesh::cuda::UploadLinear(dst, src, n, k, staging, &upload_f32_);
  }
  template <typename T>
  static void Add(std::vector<Slot>* slots, T** target, size_t count, float scale,
                  float offset = 0.0f, Slot::Kind kind = Slot::Kind::kOther) {
    Slot s;
    s.target = reinterpret_cast<void**>(target);
    s.count = count;
    s.f32 = sizeof(T) == 4;
    s.scale = scale;
    s.offset = offset;
    s.kind = kind;
    slots->push_back(s);
  }
  DeviceWeights() = default;
  // Lays out every tensor of `config`; `slots` gets their pointers and sizes.
  absl::Status Allocate(const ModelConfig& config, std::vector<Slot>* slots);
  // A MoE layer's router (and bias), shared expert and routed experts.
  void AddMoe(const ModelConfig& config, bool router_bias, DeviceLayerWeights* w,
              std::vector<Slot>* slots);
  // DeepSeek-V4's layers (device_weights_v4.cc).
  void AddV4Layers(const ModelConfig& config, std::vector<Slot>* slots);
  absl::Status UploadV4(const ModelConfig& config, const AttentionWeights& attention,
                        const ExpertShardWeights* experts);
  // Layer l's weights but its routed experts (V2/V3/V3.2), from the host,
  // but for the FP8 linears in `stored` (may be null: none), copied as the
  // checkpoint `ckpt` stores them (their views released).
  absl::Status UploadLayer(const ModelConfig& config, int l, const AttentionLayerWeights& src,
                           std::vector<uint16_t>* staging, StoredLayerLinears* stored = nullptr,
                           const Checkpoint* ckpt = nullptr);
  // The final norm and lm_head (unless tied) of `a`.
  absl::Status UploadFinal(const ModelConfig& config, const AttentionWeights& a,
                           std::vector<uint16_t>* staging);
  // A MoE layer's router, its bias and the shared expert; its routed experts.
  // (`shared_done`: the shared expert came in as stored already.)
  absl::Status UploadMoe(const ModelConfig& config, int l, const AttentionLayerWeights& src,
                         std::vector<uint16_t>* staging, bool shared_done = false);
  absl::Status UploadRoutedExperts(const ModelConfig& config, int l,
                                   const ExpertShardWeights& experts,
                                   std::vector<uint16_t>* staging);
  // Arena placement of the slots, once they are all listed.
  absl::Status Place(const ModelConfig& config, const std::vector<Slot>& slots);

  ModelConfig config_;
  bool routed_experts_ = true;
  bool fp8_linears_ = false;
  LinearFormat expert_format_ = LinearFormat::kBf16;
  int q_width_ = 0, qkv_width_ = 0;
  int kv_col_ = 0, index_col_ = 0, index_weights_col_ = 0;
  int max_fp8_k_ = 0, max_fp8_n_ = 0;
  DeviceBuffer<float> upload_f32_;  // FromHost's FP8 linears on their way to quantization
  int shared_intermediate_ = 0;
  DeviceBuffer<uint8_t> arena_;
  std::vector<DeviceLayerWeights> layers_;
  bf16* embed_ = nullptr;
  bf16* norm_ = nullptr;
  bf16* lm_head_ = nullptr;
  float* hc_head_fn_ = nullptr;
  float* hc_head_base_ = nullptr;
  float* hc_head_scale_ = nullptr;
  // For StepWeightBytes.
  double dense_bytes_ = 0;   // every tensor but the embedding and the routed experts
  double expert_bytes_ = 0;  // one routed expert of one layer
  double embed_row_bytes_ = 0;
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_DEVICE_WEIGHTS_H_
