// What the parts of one CudaModel's forward pass share (the layer stacks,
// the FFN block): the model's constants, its stream and GEMM handle, the
// device weights, the KV store, the planner's device inputs and the graph
// runner. The CudaModel owns all of them and outlives the parts; the parts
// keep a reference to this context, never ownership.
#ifndef MOESH_COMMON_CUDA_BACKEND_FORWARD_CONTEXT_H_
#define MOESH_COMMON_CUDA_BACKEND_FORWARD_CONTEXT_H_

#include <vector>

#include "absl/status/status.h"
#include "common/cuda_backend/cuda_model_options.h"
#include "common/cuda_backend/device_weights.h"
#include "common/cuda_backend/graph_runner.h"
#include "common/cuda_backend/kv_store.h"
#include "common/cuda_backend/step_planner.h"
#include "common/model/config.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"

namespace moesh::cuda {

struct ForwardContext {
  ForwardContext(const ModelConfig& c, const CudaModelOptions& o) : config(c), options(o) {}
  ForwardContext(const ForwardContext&) = delete;
  ForwardContext& operator=(const ForwardContext&) = delete;

  const ModelConfig& config;
  const CudaModelOptions& options;  // moe_tile_m may change between steps
  DeviceInfo info;
  cudaStream_t stream = nullptr;
  CublasGemm* gemm = nullptr;
  const DeviceWeights* weights = nullptr;
  const StepInputs* in = nullptr;  // the planner's
  GraphRunner* graphs = nullptr;
  KvStore* store = nullptr;  // set once the pool is sized (after the parts' scratch)
  int max_tokens = 0;        // scratch rows
  int max_rows = 0;          // head rows (sequences)
  int max_model_len = 0;
  std::vector<int> buckets;  // the decode batch sizes graphs are captured for (the planner's)
  // Non-null while CudaModel::ProfileStep runs: events 1 (after the
  // embedding), 2 + 2l (after layer l's attention), 3 + 2l (after its FFN).
  std::vector<Event>* profile = nullptr;

  // The FP8 linears' activations, quantized per row per 128 columns (rows
  // in fours), and the at most three rows past a multiple of four, whose
  // GEMM writes four (AllocateFp8Scratch sizes them when the weights hold
  // FP8 linears).
  struct Fp8Scratch {
    DeviceBuffer<uint8_t> x, tail_x;      // e4m3 [Fp8Rows(max_tokens) | 4, max_fp8_k]
    DeviceBuffer<float> x_scale, tail_s;  // [Fp8Blocks(max_fp8_k), Fp8Rows(max_tokens) | 4]
    DeviceBuffer<float> tail_y;           // [4, max_fp8_n], fp32 or bf16
  } fp8;

  KvPool& kv() const { return store->pool(); }
  int max_blocks_per_seq() const { return in->max_blocks_per_seq; }
  // y[m, n] (+)= x[m, k] · w[n, k]^T on the stream (kernels/cuda/gemm.h).
  absl::Status Gemm(const bf16* x, int ldx, const bf16* w, void* y, int ldy, int m, int n, int k,
                    OutType out, bool accumulate) const;
  // The same with w in either format: an FP8 w quantizes x on the fly
  // (kernels/cuda/fp8.h) into the scratch above and runs the block-scaled
  // GEMM (y's rows m.. untouched). On `on` (null: the context's stream);
  // another stream only where OnFp8Gemv (cuBLAS's workspace and the FP8
  // scratch are the context stream's).
  absl::Status Gemm(const bf16* x, int ldx, const DeviceLinear& w, void* y, int ldy, int m, int n,
                    int k, OutType out, bool accumulate, cudaStream_t on = nullptr) const;
  // Whether Gemm of an FP8 w with m rows and depth k runs on RunFp8Gemv.
  bool OnFp8Gemv(const DeviceLinear& w, int m, int k) const;
  // A batch of bf16 GEMMs (MLA's absorbed per-head products): RunBf16Gemv
  // where options.bf16_gemv and it fits (decode sizes), else cuBLASLt's.
  absl::Status Batched(const BatchedGemmParams& p) const;
  // Sizes `fp8` for max_tokens rows and the weights' FP8 linears (none:
  // nothing). REQUIRES: weights and max_tokens set.
  absl::Status AllocateFp8Scratch();
  // Records profiling event `index` iff profiling.
  absl::Status Mark(int index) const;
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_FORWARD_CONTEXT_H_
