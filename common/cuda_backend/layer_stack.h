// A model family's layers on the GPU behind one interface: the embedding,
// every decoder layer (attention with the family's cache rows, then the FFN
// block) and the final norm, enqueued on the context's stream. The CudaModel
// coordinates: it plans the step, runs a stack's pass eagerly or in a CUDA
// graph, and applies lm_head and the sampler to the stack's normed rows.
//
// Families: MlaLayerStack (DeepSeek-V2, V2-Lite, V3/R1 and V3.2's lightning
// indexer with sparse MLA; mla_layer_stack.h) and V4LayerStack (DeepSeek-V4's
// mHC, sliding window and compressed attention; v4_layer_stack.h).
// MakeLayerStack (make_layer_stack.cc) picks by the config.
//
// Not thread-safe: its model's caller's thread.
#ifndef MOESH_COMMON_CUDA_BACKEND_LAYER_STACK_H_
#define MOESH_COMMON_CUDA_BACKEND_LAYER_STACK_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "common/cuda_backend/ffn_block.h"
#include "common/cuda_backend/forward_context.h"
#include "common/cuda_backend/step_planner.h"
#include "common/model/expert_client.h"

namespace moesh::cuda {

class LayerStack {
 public:
  virtual ~LayerStack() = default;

  // Device bytes per KV block the family keeps beside the cache rows (V4's
  // compressed entries); the pool is sized with them.
  virtual size_t ExtraBlockBytes() const { return 0; }
  // The KV store exists (ctx.store set), of `num_blocks` blocks.
  virtual absl::Status AttachPool(int num_blocks) { return absl::OkStatus(); }
  // Whether the stack reads the planner's segments (seg_last / seg_from).
  virtual bool needs_segments() const { return false; }

  // Embeds pass `b`'s tokens (uploaded: ctx.in) and enqueues every layer,
  // writing the layers' cache rows. `experts` non-null: the routed experts
  // run behind it (FfnBlock).
  virtual absl::Status Enqueue(const StepBatch& b, ExpertClient* experts) = 0;
  // The final norm of `num_rows` of the pass's `num_tokens` rows, device
  // row indices `rows` (ctx.in->head_rows for the head; an iota slice for
  // every position), into out [num_rows, hidden] (bf16, lm_head's input).
  virtual absl::Status EnqueueFinalNorm(int num_tokens, int num_rows, const int32_t* rows,
                                        bf16* out) = 0;

  // Rows [from, to) of sequence `seq` came into the cache from outside (the
  // KV handoff): what the family derives from cache rows (V4's compressed
  // entries), computed now; synchronous.
  virtual absl::Status RowsArrived(int seq, int from, int to) { return absl::OkStatus(); }
  // Random values in the family's own cache parts (benchmarks).
  virtual absl::Status FillCacheRandom(uint64_t seed) { return absl::OkStatus(); }

 protected:
  // The stack's scratch and tables, once, before any other call (MakeLayerStack).
  virtual absl::Status Init() = 0;

 private:
  friend absl::StatusOr<std::unique_ptr<LayerStack>> MakeLayerStack(const ForwardContext& ctx,
                                                                    FfnBlock* ffn);
};

// The family's stack for ctx.config, its scratch allocated for ctx's limits.
// REQUIRES: ctx set but for ctx.store; `ffn` outlives the stack.
absl::StatusOr<std::unique_ptr<LayerStack>> MakeLayerStack(const ForwardContext& ctx,
                                                           FfnBlock* ffn);

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_LAYER_STACK_H_
