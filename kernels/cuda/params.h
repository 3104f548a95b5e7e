// Parameters of the CUDA ops, one struct per op, each carrying its stream.
//
// Every tensor pointer is device memory, row-major, with its shape in the
// comment; "ld" fields are row strides in elements (0: packed). Activations
// and weights are bf16; accumulation is fp32 everywhere.
#ifndef MOESH_KERNELS_CUDA_PARAMS_H_
#define MOESH_KERNELS_CUDA_PARAMS_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/fp8.h"
#include "kernels/cpu/moe_gate.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/tile_config.h"

namespace moesh::cuda {

using bf16 = __nv_bfloat16;
// The CPU backend's enums: the two backends implement the same semantics.
using cpu::GateScoring;
using cpu::GateSelect;
using cpu::RopeLayout;

enum class OutType { kBf16, kFloat32 };

// The paged KV cache's rows: bf16 values, or FlashMLA's FP8 rows
// (cpu::Fp8KvRowLayout over kv_lora_rank + rope: e4m3 latent codes, a
// power-of-two float32 scale per 128 of them, the rope part in bf16;
// --kv_cache_dtype fp8). Cache pointers stay bf16* and row strides count
// 2-byte units in both: an FP8 row is Fp8KvRowLayout::bytes() / 2 of them.
enum class KvCacheDtype { kBf16, kFp8 };

// y[m, n] = x[m, k] · w[n, k]^T (+ y if accumulate).
struct GemmParams {
  const bf16* x = nullptr;  // [m, ldx]
  const bf16* w = nullptr;  // [n, k] (nn.Linear's weight)
  void* y = nullptr;        // [m, ldy], bf16 or fp32 per out_type
  OutType out_type = OutType::kBf16;
  int m = 0, n = 0, k = 0;
  int ldx = 0, ldy = 0;
  bool accumulate = false;
  cudaStream_t stream = nullptr;
};

// y[m, n] = x[m, k] · w[n, k]^T in DeepSeek's block-scaled FP8
// (kernels/cpu/fp8.h, the reference): e4m3 operands, x with one scale per row
// per 128 columns (RunQuantizeFp8 makes it), w with one per 128 x 128 block
// (the checkpoint's weight_scale_inv); fp32 accumulation, bf16 or fp32 out.
// The scales are laid out as cuBLASLt's block scaling reads them, and its
// kernels take rows in fours: the activations' buffers hold Fp8Rows(m) rows
// (RunQuantizeFp8 zeroes those past m; so are y's).
struct Fp8GemmParams {
  const uint8_t* x = nullptr;  // e4m3 [Fp8Rows(m), k]
  const float* x_scale =
      nullptr;                 // [Fp8Blocks(k), Fp8Rows(m)]: row i's block b at b * Fp8Rows(m) + i
  const uint8_t* w = nullptr;  // e4m3 [n, k]
  // [Fp8Blocks(n), Fp8ScaleStride(k)]: block (row block j, column block b) at
  // j * Fp8ScaleStride(k) + b (the checkpoint's [n/128, k/128], rows padded to 4).
  const float* w_scale = nullptr;
  void* y = nullptr;  // [Fp8Rows(m), ldy], bf16 or fp32 per out_type
  OutType out_type = OutType::kBf16;
  int m = 0, n = 0, k = 0;
  int ldy = 0;              // 0: n
  bool accumulate = false;  // y += instead of y =
  // RunFp8Gemv only: x as bf16 [m, ldx] (ldx >= k, a multiple of 8; 0: k),
  // quantized inside the GEMV exactly as RunQuantizeFp8 would (x and x_scale
  // then unused): one launch fewer a linear at decode sizes.
  const bf16* x_bf16 = nullptr;
  int ldx = 0;
  cudaStream_t stream = nullptr;
};
// Rows of the FP8 GEMM's activation and output buffers: m rounded up to 4
// (each column of x_scale 16-byte aligned; cuBLASLt has no kernel otherwise).
constexpr int Fp8Rows(int m) { return (m + 3) / 4 * 4; }
// A weight scale row's stride: its Fp8Blocks(k) scales rounded up to 4 (16 bytes).
constexpr int Fp8ScaleStride(int k) { return (cpu::Fp8Blocks(k) + 3) / 4 * 4; }

// q[m, k] = e4m3(x / scale) with scale = max(max|x|, 1e-10) / 448 per row and
// 128 columns: kernels/cpu/fp8.h's QuantizeFp8Rows, bit for bit, with the
// scales laid out as Fp8GemmParams::x_scale; rows m..Fp8Rows(m) as zeros.
// With `index`, row i is x's row index[i] (the MoE's permuted rows); with
// `count`, rows from *count on (read on the device: a graph-captured pass's
// real row count under a host bound m) are zeros too, and x is not read there.
struct QuantizeFp8Params {
  const bf16* x = nullptr;         // [*, ldx]
  const int32_t* index = nullptr;  // [m]; may be null (row i is x's row i)
  const int32_t* count = nullptr;  // device scalar; may be null (m rows)
  uint8_t* q = nullptr;            // e4m3 [Fp8Rows(m), k]
  float* scale = nullptr;          // [Fp8Blocks(k), Fp8Rows(m)]
  int m = 0, k = 0;
  int ldx = 0;  // 0: k
  cudaStream_t stream = nullptr;
};

// q[n, k] = e4m3(w / scale) with scale = max(max|w|, 1e-10) / 448 per 128 x
// 128 block: kernels/cpu/fp8.h's QuantizeFp8Blocks bit for bit (of the fp32
// values, or of the bf16 ones widened), the scales laid out as
// Fp8GemmParams::w_scale (the padding columns of a scale row untouched). A
// weight quantized at load (`--quantization fp8`, dummy FP8 weights).
struct QuantizeFp8BlocksParams {
  const float* w_f32 = nullptr;  // [n, k]; exactly one of w_f32, w_bf16
  const bf16* w_bf16 = nullptr;  // [n, k]
  uint8_t* q = nullptr;          // e4m3 [n, k]
  float* scale = nullptr;        // [Fp8Blocks(n), Fp8ScaleStride(k)]
  int n = 0, k = 0;
  cudaStream_t stream = nullptr;
};

// packed[n, k / 2], scale[n, k / 32] = MXFP4 of w[n, k]: kernels/cpu/mxfp4.h's
// QuantizeMxfp4 bit for bit (on the bf16 values widened). A weight quantized
// at load (dummy MXFP4 routed experts).
struct QuantizeMxfp4Params {
  const bf16* w = nullptr;   // [n, k]
  uint8_t* q = nullptr;      // e2m1 pairs [n, k / 2], the even input in the low nibble
  uint8_t* scale = nullptr;  // ue8m0 [n, k / 32]
  int n = 0, k = 0;
  cudaStream_t stream = nullptr;
};

// For b in [0, batch): y_b[m, n] = x_b[m, k] · w_b[n, k]^T (+ y_b if accumulate),
// with x_b = x + b * stride_x and likewise for w (rows ldw apart) and y
// (strides and ld in elements).
struct BatchedGemmParams {
  const bf16* x = nullptr;  // batch × [m, ldx]
  const bf16* w = nullptr;  // batch × [n, ldw], or [k, ldw] if w_kn
  void* y = nullptr;        // batch × [m, ldy], bf16 or fp32 per out_type
  OutType out_type = OutType::kBf16;
  int batch = 1, m = 0, n = 0, k = 0;
  int ldx = 0, ldw = 0, ldy = 0;  // 0: k, k (n if w_kn), n
  // stride_x 0: every GEMM reads the same x (e.g. MLA's latent rows, expanded per head).
  int64_t stride_x = 0, stride_w = 0, stride_y = 0;
  bool w_kn = false;  // w_b stored as [k, n] (y_b = x_b · w_b), e.g. MLA's W_UK^T per head
  bool accumulate = false;
  cudaStream_t stream = nullptr;
};

// y = x * rsqrt(mean(x^2) + eps) * weight, per row. y may alias x.
struct RmsNormParams {
  const bf16* x = nullptr;       // [rows, ldx]
  const bf16* weight = nullptr;  // [n]
  bf16* y = nullptr;             // [rows, ldy]
  int rows = 0, n = 0, ldx = 0, ldy = 0;
  float eps = 1e-6f;
  cudaStream_t stream = nullptr;
};

// x += residual (rounded to bf16, written back); y = rmsnorm(x) * weight.
struct AddRmsNormParams {
  bf16* x = nullptr;               // [rows, ldx], in/out
  const bf16* residual = nullptr;  // [rows, ld_residual]
  const bf16* weight = nullptr;    // [n]
  bf16* y = nullptr;               // [rows, ldy]; must not alias x or residual
  int rows = 0, n = 0, ldx = 0, ld_residual = 0, ldy = 0;
  float eps = 1e-6f;
  cudaStream_t stream = nullptr;
};

// The rotation shared by the RoPE ops: kernels/cpu/rope.cc RunRope's math,
// angle = inv_freq[i] * position in fp32, cos/sin times attention_factor.
struct RopeTableView {
  const float* inv_freq = nullptr;  // [dim / 2], device
  float attention_factor = 1.0f;
  int dim = 0;  // rope dims, even
  RopeLayout layout = RopeLayout::kInterleaved;
};

// Rotates, in place, the rope slice x[t, r, offset : offset + dim] of every
// token t and row r (e.g. the q_pe part of every head) at positions[t].
struct RopeParams {
  bf16* x =
      nullptr;  // [num_tokens, token_stride]; row r of token t at t*token_stride + r*row_stride
  int num_tokens = 0, num_rows = 0;
  int token_stride = 0, row_stride = 0, offset = 0;
  const int32_t* positions = nullptr;  // [num_tokens]
  RopeTableView rope;
  cudaStream_t stream = nullptr;
};

// One decode/prefill step's cache write, fused: per token t with
// slot_mapping[t] >= 0,
//   cache[slot] = [ rmsnorm(kv[t, :rank]) * kv_norm_weight  (or kv[t, :rank] as is
//                   when kv_norm_weight is null) | rope(kv[t, rank : rank + dim]) ].
// Optionally also ropes the queries (q may be null): q as RopeParams, in
// place, or (q_src set) from q_src's rope slices into q's (the slice copy of
// the absorbed query's rope part fused in).
// Cache layout: [num_blocks, kKvBlockSize, rank + rope.dim]; slot = block * kKvBlockSize + offset.
struct RopeKvCacheParams {
  const bf16* kv = nullptr;  // [num_tokens, kv_ld]: [latent (rank) | k_pe (rope.dim)]
  int kv_ld = 0;
  const bf16* kv_norm_weight = nullptr;  // [rank]; may be null
  float eps = 1e-6f;
  bf16* cache = nullptr;     // [num_blocks, kKvBlockSize, cache_row_stride]
  int cache_row_stride = 0;  // 0: rank + rope.dim (V3.2's rows carry its indexer key after them)
  // kFp8: the row is quantized as cpu::PackFp8KvRow does (the same codes and
  // scales from the same float32 values: the normalized latent unrounded),
  // cache_row_stride 0, the layout's bytes / 2 (its padding zeroed), or more
  // in whole 16 bytes (V3.2: its index key follows the rope part, written by
  // RunIndexKey; nothing past the rope part is written here); kv_lora_rank a
  // multiple of 16, at most 1024.
  KvCacheDtype cache_dtype = KvCacheDtype::kBf16;
  int num_blocks = 0;
  const int32_t* slot_mapping = nullptr;  // [num_tokens]; < 0: padding, not written
  int num_tokens = 0, kv_lora_rank = 0;
  bf16* q =
      nullptr;  // may be null; [num_tokens, q_token_stride], q_num_heads rows of q_head_stride
  int q_num_heads = 0, q_token_stride = 0, q_head_stride = 0, q_rope_offset = 0;
  // May be null (q roped in place); else q's rope slices are read from here,
  // [num_tokens, q_src_token_stride], q_num_heads rows of q_src_head_stride,
  // the slice at q_src_offset. Must not overlap q's slices.
  const bf16* q_src = nullptr;
  int q_src_token_stride = 0, q_src_head_stride = 0, q_src_offset = 0;
  const int32_t* positions = nullptr;  // [num_tokens]
  RopeTableView rope;
  cudaStream_t stream = nullptr;
};

// out[m, i] = silu(gate_up[m, :i]) * gate_up[m, i : 2i].
struct SiluAndMulParams {
  const bf16* gate_up = nullptr;  // [m, 2i]
  bf16* out = nullptr;            // [m, i]
  int m = 0, i = 0;
  cudaStream_t stream = nullptr;
  // > 0 clamps first, as cpu::SiluAndMul (DeepSeek-V4's swiglu_limit): gate
  // to <= limit, up to [-limit, limit].
  float limit = 0.0f;
};

// kernels/cpu/moe_gate.h's MoeGateParams on the device.
struct MoeGateParams {
  const float* logits = nullptr;  // [num_tokens, num_experts]
  const float* bias = nullptr;    // [num_experts]; may be null
  int num_tokens = 0, num_experts = 0, top_k = 0;
  int n_group = 1, topk_group = 1;
  GateScoring scoring = GateScoring::kSoftmax;
  GateSelect select = GateSelect::kGreedy;
  bool renormalize = false;
  float routed_scaling_factor = 1.0f;
  // Hash routing (DeepSeek-V4's hash_moe layers): non-null, token t's experts
  // are forced_table[token_ids[t], :] in that order and no selection runs;
  // their weights are still the scores (kernels/cpu/moe_gate.h forced_ids).
  const int32_t* forced_table = nullptr;  // [vocab, top_k]
  const int32_t* token_ids = nullptr;     // [num_tokens]
  int32_t* topk_ids = nullptr;            // [num_tokens, top_k], best first
  float* topk_weights = nullptr;          // [num_tokens, top_k]
  cudaStream_t stream = nullptr;
};

// MLA decode with absorbed weights over the paged latent cache: for each
// sequence b and head h, one query row attends to the first seq_lens[b] cache
// rows of b:
//   s_t = softmax_scale * q[b, h, :] · row_t[:],  p = softmax(s),
//   out[b, h, :] = sum_t p_t * row_t[:kv_lora_rank],
// row_t = cache[block_table[b, t / 64], t % 64, :]. seq_lens[b] == 0 gives zeros.
struct MlaDecodeParams {
  const bf16* q = nullptr;         // [batch, num_heads, kv_lora_rank + rope_dim]
  const bf16* kv_cache = nullptr;  // [num_blocks, kKvBlockSize, kv_lora_rank + rope_dim]
  // kFp8: FP8 rows (KvCacheDtype), kv_row_stride 0 or their bytes / 2 (the
  // generic kernel: or more, a wider row's values after the rope part).
  KvCacheDtype kv_dtype = KvCacheDtype::kBf16;
  const int32_t* block_table = nullptr;  // [batch, max_blocks_per_seq]
  const int32_t* seq_lens = nullptr;     // [batch], each in [0, max_seq_len]
  int batch = 0, num_heads = 0;
  int kv_lora_rank = 512, rope_dim = 64;  // the kernel's compile-time dims
  int num_blocks = 0, max_blocks_per_seq = 0;
  int max_seq_len = 0;  // host-side bound on seq_lens; <= max_blocks_per_seq * 64
  float softmax_scale = 1.0f;
  void* out = nullptr;  // [batch, num_heads, kv_lora_rank], per out_type
  OutType out_type = OutType::kFloat32;
  float* lse = nullptr;  // [batch, num_heads] natural-log sum-exp of s; may be null
  // From PlanMlaDecode(); the workspace holds the split partials.
  int num_splits = 1;
  void* workspace = nullptr;  // >= the plan's workspace_bytes; may be null iff those are 0
  size_t workspace_bytes = 0;
  MlaTileConfig tile = MlaTileConfig::kDefault;  // must match the plan's
  cudaStream_t stream = nullptr;
  // The cache's row stride (0: kv_lora_rank + rope_dim), and a sparse
  // selection (DeepSeek-V3.2's indexer): non-null, row t < seq_lens[b] of
  // query b is position kv_index[b * kv_index_stride + t]. Read by
  // RunMlaAttentionGeneric, and by RunMlaDecode's 16-head bf16 kernel (a
  // kTokens* tile) and 64-head FP8 kernel (rows fetched one by one,
  // straight from the pool).
  int kv_row_stride = 0;
  const int32_t* kv_index = nullptr;
  int kv_index_stride = 0;
};

// MLA prefill attention in the expanded (non-absorbed) form, causal, for one
// sequence: its num_q new queries against num_k of its context rows, the
// keys and values expanded from the latent rows by kv_b_proj (K's no-rope
// part and V per head; the roped key part shared by all heads). Query i is
// at position q_pos0 + i, key j at k_pos0 + j; query i attends to the keys
// with k_pos0 + j <= q_pos0 + i:
//   s_ij = softmax_scale * (q_nope[i,h]·k_nope[j,h] + q_pe[i,h]·k_pe[j]),
//   out[i,h] = sum_j softmax_j(s_ij) v[j,h].
// Dims are mla_prefill's (config.h): 128 + 64 for q·k, 128 for v. A context
// longer than one call's keys runs in calls over consecutive key ranges, each
// after the first with `merge`: out and lse then hold the earlier ranges'
// result and are combined with this range's (out rounded to bf16 between
// calls). A query that sees no key of any range gets zeros and lse -inf.
struct MlaPrefillParams {
  const bf16* q_nope = nullptr;  // [num_q, q_nope_ld]: head h at h * q_nope_head_stride
  const bf16* q_pe = nullptr;    // [num_q, q_pe_ld]: head h at h * q_pe_head_stride, roped
  int64_t q_nope_ld = 0, q_pe_ld = 0;
  int q_nope_head_stride = 0, q_pe_head_stride = 0;
  const bf16* k_nope = nullptr;  // [num_k, kv_ld]: head h at h * kv_head_stride
  const bf16* v = nullptr;       // [num_k, kv_ld]: head h at h * kv_head_stride
  int64_t kv_ld = 0;
  int kv_head_stride = 0;
  const bf16* k_pe = nullptr;  // [num_k, k_pe_ld], roped, shared by the heads
  int64_t k_pe_ld = 0;
  int num_q = 0, num_k = 0, num_heads = 0;
  int q_pos0 = 0, k_pos0 = 0;
  float softmax_scale = 1.0f;
  bf16* out = nullptr;  // [num_q, out_ld]: head h at h * out_head_stride
  int64_t out_ld = 0;
  int out_head_stride = 0;
  // [num_q, num_heads]: log2 of sum_j 2^(s_ij · log2 e) over the keys seen so
  // far; may be null iff !merge (then not written).
  float* lse = nullptr;
  bool merge = false;
  MlaPrefillImpl impl = MlaPrefillImpl::kMmaSync;
  cudaStream_t stream = nullptr;
};

// Greedy argmax plus the top-k log-probabilities, per row of logits.
// Ties go to the lower token id.
struct GreedyLogprobsParams {
  const float* logits = nullptr;  // [batch, ld]; the first vocab entries of a row count
  int batch = 0, vocab = 0, ld = 0;
  int top_k = 0;                   // [0, sampling::kMaxTopK]
  int32_t* next_ids = nullptr;     // [batch]: argmax
  float* next_logprobs = nullptr;  // [batch]: its log-probability; may be null
  int32_t* topk_ids = nullptr;     // [batch, top_k], best first; may be null iff top_k == 0
  float* topk_logprobs = nullptr;  // [batch, top_k]
  cudaStream_t stream = nullptr;
};

// Sampling one token per row of logits, common/engine/sampler.h's
// Sampler::SampleWithDraw semantics (penalties, temperature, top-k, top-p,
// min-p, the draw given), one CTA per row. The row's logits are overwritten
// (penalised, divided by the temperature): take log-probabilities first.
struct SampleRow {
  float temperature =
      0.0f;            // below sampling::kMinTemperature (1e-5): argmax of the penalised logits
  int top_k = 0;       // 0: all
  float top_p = 1.0f;  // (0, 1]
  float min_p = 0.0f;  // [0, 1]
  float repetition_penalty = 1.0f, presence_penalty = 0.0f, frequency_penalty = 0.0f;
  int penalty_begin = 0, penalty_end = 0;  // this row's entries of SampleParams::penalties
  double draw = 0.0;                       // in [0, 1): Sampler::Draw(step)
};
// A token of the prompt or the output: repetition-penalised; presence- and
// frequency-penalised iff output_count > 0. At most one entry per token per row.
struct PenaltyEntry {
  int32_t id = 0;
  int32_t output_count = 0;
};
struct SampleParams {
  float* logits = nullptr;  // [batch, ld], overwritten; the first vocab entries of a row count
  int batch = 0, vocab = 0, ld = 0;
  const SampleRow* rows = nullptr;          // [batch]
  const PenaltyEntry* penalties = nullptr;  // rows' ranges; may be null iff every range is empty
  int32_t* ids = nullptr;                   // [batch]: the tokens
  cudaStream_t stream = nullptr;
};

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_PARAMS_H_
