// DeepSeek-V4 on the GPU (layer_stack.h; common/model/v4_model.cc is the CPU
// reference, whose cache row layout the device cache shares). Per layer, for
// the T tokens of a pass:
//   x [T, hc, hidden] fp32 → fn GEMM (fp32) → mHC pre (collapse) → RMSNorm →
//   one GEMM [wq_a | the cache row's projections | index weights] →
//   q_norm → wq_b → per-head RMSNorm + RoPE; the row's kv norm + RoPE and its
//   cache write; (CSA) the index query; (CSA, HCA) the compressed entries of
//   every segment, (CSA) the indexer's top-k; attention with sinks over the
//   window and the entries, inverse RoPE → wo_a (per group) → wo_b → y →
//   mHC post into x; the same mHC pair around the FfnBlock (MoE), whose
//   shared and routed experts accumulate into y.
// The final norm collapses each sequence's last row with the hc head, then
// RMSNorm.
//
// The compressed entries live in a pool of their own beside the KV store's
// (entry e of a sequence at its row e: the same block ids), computed once
// per entry, in a pass or from rows that arrived (RowsArrived).
#ifndef MOESH_COMMON_CUDA_BACKEND_V4_V4_LAYER_STACK_H_
#define MOESH_COMMON_CUDA_BACKEND_V4_V4_LAYER_STACK_H_

#include <memory>

#include "common/cuda_backend/attention_scratch.h"
#include "common/cuda_backend/kv_pool.h"
#include "common/cuda_backend/layer_stack.h"
#include "kernels/cuda/v4_ops.h"

namespace moesh::cuda {

class V4LayerStack : public LayerStack {
 public:
  V4LayerStack(const ForwardContext& ctx, FfnBlock* ffn) : ctx_(ctx), ffn_(ffn) {}

  size_t ExtraBlockBytes() const override;
  absl::Status AttachPool(int num_blocks) override;
  bool needs_segments() const override { return true; }
  absl::Status Enqueue(const StepBatch& b, ExpertClient* experts) override;
  absl::Status EnqueueFinalNorm(int num_tokens, int num_rows, const int32_t* rows,
                                bf16* out) override;
  absl::Status RowsArrived(int seq, int from, int to) override;
  absl::Status FillCacheRandom(uint64_t seed) override;

 private:
  absl::Status Init() override;
  // mHC before a sublayer: its collapse of x_ RMSNorm'd into normed_ (and,
  // for the router's fp32 GEMM, normed_f32_).
  absl::Status EnqueueMhcPre(const float* fn, const float* base, const float* scale,
                             const bf16* norm, int num_tokens, bool router_input);
  absl::Status EnqueueMhcPost(int num_tokens);
  absl::Status EnqueueAttention(const StepBatch& b, int layer);
  // Layer l's compressors over `num_segs` segments of the step inputs.
  absl::Status EnqueueCompress(int layer, int num_segs, int max_new);
  // fast_: RunV4Attention's math on the tuned MLA kernel over the keys
  // gathered densely into keys_.
  absl::Status EnqueueFastAttention(const V4AttentionParams& ap);

  const ForwardContext& ctx_;
  FfnBlock* const ffn_;
  // Activations, [max_tokens, ...]; x_ is [T, hc_mult, hidden], y_ the
  // sublayer output mHC mixes in.
  DeviceBuffer<float> x_, normed_f32_, mix_, post_, comb_, collapsed_, y_;
  DeviceBuffer<bf16> normed_, qa_, a_, q_, attn_, grouped_;
  IndexerScratch index_;  // CSA layers
  // Compressed entries, each computed once (v4_ops.h V4CompressParams):
  // per layer, [head_dim kv entry | index_head_dim index entry (CSA)], bf16.
  std::unique_ptr<KvPool> entries_;
  int entry_width_ = 0, min_rate_ = 0;
  DeviceBuffer<float> main_inv_freq_, compress_inv_freq_;
  RopeTableView main_rope_, compress_rope_;
  // head_dim 512 (the MLA kernel's latent width): attention on the tuned kernel.
  bool fast_ = false;
  MlaScratch keys_;
  DeviceBuffer<bf16> q576_;
  DeviceBuffer<int32_t> key_count_;
  DeviceBuffer<float> o_, lse_;
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_V4_V4_LAYER_STACK_H_
