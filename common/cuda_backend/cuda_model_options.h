// CudaModel's options (common/cuda_backend/cuda_model.h), in their own header
// so that the model's parts (planner, layer stacks, FFN block) read them
// without the coordinator's header.
#ifndef MOESH_COMMON_CUDA_BACKEND_CUDA_MODEL_OPTIONS_H_
#define MOESH_COMMON_CUDA_BACKEND_CUDA_MODEL_OPTIONS_H_

#include "kernels/cuda/tile_config.h"

namespace moesh::cuda {

// Which MLA attention kernel runs: the tuned ones where they are built for
// the widths (latent 512, rope 64; 64 heads per CTA from 64 heads up, else
// 16), else the plain one; or the tuned 16-head kernel at any head count
// (the baseline the 64-head kernel is measured against); or always the plain
// one (a cross-check of the tuned kernels inside the whole model).
enum class MlaKernel { kAuto, kHeads16, kGeneric };

// The tile configuration the tuned MLA kernel runs with under `k`.
inline MlaTileConfig MlaTile(MlaKernel k) {
  return k == MlaKernel::kHeads16 ? MlaTileConfig::kTokens32Stages2 : MlaTileConfig::kDefault;
}

// How prefill attends in the MLA families without an indexer (V2, V2-Lite,
// V3/R1) at DeepSeek's head widths (q·k 128 + 64, v 128, latent 512):
// absorbed, through the decode kernel, each new token a query row reading
// its whole prefix; or expanded (kernels/cuda/mla_prefill.h): the context's
// latent rows expanded to per-head keys and values by kv_b_proj, then
// FlashAttention-style tiles of 64 queries sharing each key. kAuto expands a
// sequence that brings at least kMlaExpandedMinTokens new tokens in a pass.
// Decode steps are always absorbed.
enum class MlaPrefill { kAuto, kAbsorbed, kExpanded };
inline constexpr int kMlaExpandedMinTokens = 64;

struct CudaModelOptions {
  // Fraction of the device's total memory that everything on it may use once
  // this model is loaded (other processes' memory counts); the KV cache gets
  // what the weights and scratch buffers leave of it.
  double gpu_memory_utilization = 0.9;
  int max_num_seqs = 256;          // sequences per step; decode graphs cover batches up to it
  int max_model_len = 0;           // tokens per sequence; 0: min(max_position_embeddings, 8192)
  int max_tokens_per_step = 8192;  // longer prefills run in chunks of this many tokens
  bool cuda_graphs = true;  // decode steps (one token per sequence) replay a graph per batch bucket
  int max_kv_blocks = 0;    // > 0: at most this many cache blocks (tests)
  MlaKernel mla_kernel = MlaKernel::kAuto;
  // kAuto (a sequence bringing >= 64 new tokens attends in the expanded form)
  // measured faster (H100, cuda_model_bench 4 x 4096-token prompts: V2-Lite
  // 71.8k tok/s against 36.3k absorbed, V3's 128 heads 93.4k against 72.8k)
  // and matched the CPU engine in cuda_mla_prefill_model_test, the goldens
  // and the FP8 KV cache's tests.
  MlaPrefill mla_prefill = MlaPrefill::kAuto;
  // > 0: the expanded prefill's context rows expanded at a time (tests: a
  // long context in several merged ranges); 0: as many as 256 MiB of
  // expanded keys and values hold, up to max_model_len.
  int mla_prefill_chunk_rows = 0;
  // The expanded prefill's kernel: wgmma's (kernel_bench --mla-prefill-table,
  // H100: 2.1-2.5x the mma.sync kernel's TFLOP/s at 4K-64K tokens).
  MlaPrefillImpl mla_prefill_impl = MlaPrefillImpl::kWgmma;
  int moe_tile_m = 0;           // rows per expert tile: 16, 32 or 64; 0 picks by rows per expert
  bool record_routing = false;  // keep each pass's expert choices (LastRouting)
  // False: the routed experts are not loaded on this device; every forward
  // pass then takes an ExpertClient (the disaggregated attention worker).
  bool routed_experts_on_device = true;
  // The linears (attention projections, dense and shared-expert MLPs on
  // FP8 tensor cores; the routed experts as FP8 weights widened to bf16 in
  // the grouped GEMM) in DeepSeek's block-scaled FP8, quantized at load
  // (--quantization fp8); a checkpoint with an FP8 quantization_config always
  // runs so. The embedding, lm_head, routers (fp32) and MLA's absorbed
  // W_UK/W_UV stay bf16.
  bool fp8_linears = false;
  // Full cache blocks are shared between sequences whose tokens begin alike
  // (kv_store.h). Off for DeepSeek-V4 whatever this says: its compressed
  // entries sit in the same block ids at other rows (entry e at row e), so
  // a sequence would write into blocks it shares.
  bool prefix_cache = false;
  // --kv_cache_dtype fp8: the paged cache holds FlashMLA's FP8 rows (656
  // bytes a token at V3's widths against 1152 in bf16; KvRowSpec::Fp8),
  // written by the KV-write kernel and widened in the MLA kernels' shared
  // memory. MLA models (V2, V2-Lite, V3, R1, and V3.2: its index key in bf16
  // after the rope part, its selection gathered and widened).
  bool fp8_kv_cache = false;
  // DeepSeek-V3.2's sparse attention at the tuned widths: each token's
  // selected rows gathered into a dense copy the tuned kernel reads (true),
  // or read straight from the pool through the selection by the 16-head
  // kernel (false: no copy; kernels/cuda/mla_decode.h). The direct read (H100,
  // V3.2 shapes, 3 layers, 16K context: 2.617 / 4.584 ms a step at batch 1 /
  // 32 against the copy's 2.661 / 4.616). An FP8 cache always gathers (the
  // 16-head kernel reads no FP8 selection).
  bool sparse_mla_gather = false;
  // The lightning indexer's scores (V3.2, V4's CSA layers) on the tensor
  // cores where its shape is DeepSeek's (64 heads × 128 dims; RunIndexer's
  // tensor_cores), else on the CUDA cores. Measured faster (H100, V3.2
  // shapes, 16K context: the step at batch 32 3.339 against 4.584 ms; a 16K
  // prompt 43.2k against 23.3k tok/s); IndexerCacheTest and the V3.2 goldens
  // pass on both.
  bool indexer_tensor_cores = true;
  // FP8 linears at decode sizes (up to kFp8GemvMaxRows rows, k a multiple of
  // 64) through RunFp8Gemv (kernels/cuda/fp8.h: the weight rows as the MMA's
  // M, no four-row padding) where k <= kFp8GemvMaxK, else cuBLASLt's
  // block-scaled GEMM (kernel_bench --fp8, H100: the GEMV wins at k 1536-7168,
  // loses at 16384-18432; V2-Lite FP8 step at batch 1: 3.824 against 4.216 ms).
  bool fp8_gemv = true;
  // MLA's absorbed W_UK / W_UV per head (bf16 in every format) at up to 8
  // rows a head through RunBf16Gemv (kernels/cuda/bf16_gemv.h: one launch
  // that pulls its weights into L2 while the kernel before it runs) instead
  // of cuBLASLt's batched GEMM, which launches plainly.
  bool bf16_gemv = true;
  // FP8 routed experts (an FP8 checkpoint or --quantization fp8): their
  // inputs quantized per row and 128 columns too and both expert GEMMs on
  // the FP8 tensor cores (ExpertMlpParams::act_fp8: DeepSeek's own scheme),
  // else the weights widened to bf16 in the grouped GEMM. Where hidden and
  // the expert width are multiples of 128, and only for 64-row (prefill)
  // tiles, where the wgmma kernel runs: H100, 16384 x 6 rows at V2-Lite's
  // experts 1853 (with the quantization) against 6131 us; at decode tiles the
  // widening kernel is the faster (256 x 6: 158.3 against 173.2 us).
  bool fp8_expert_act = true;
  // The shared experts' MLP on a second stream, beside the router, gate and
  // routed experts of its layer, where both its linears run on the FP8 GEMV
  // (decode sizes) and the routed experts are on this device: it streams its
  // weights while the routed experts' grouped GEMM leaves bandwidth spare.
  // Forked at the MoE input, joined before the routed sum is added, so the
  // sums are the same bits either way (cuda_fp8_model_test). H100, V2-Lite
  // FP8 decode steps: 0.905x at batch 1, 0.92-0.93x at 4 and 8 (DeepSeek-V3
  // layer shapes, one shared expert: 1.00x / 0.99x at batch 1 / 8).
  bool shared_expert_stream = true;
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_CUDA_MODEL_OPTIONS_H_
