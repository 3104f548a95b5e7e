// Parameters of the ops the CUDA model adds to kernels/cuda: one struct per
// op, each with its stream (kernels/cuda/params.h's conventions: device
// pointers, row-major, shapes in the comments, "ld" in elements).
#ifndef MOESH_KERNELS_CUDA_MODEL_PARAMS_H_
#define MOESH_KERNELS_CUDA_MODEL_PARAMS_H_

#include <cstdint>

#include "kernels/cuda/params.h"

namespace moesh::cuda {

// out[t, j, :] = float(table[token_ids[t], :]) for j in [0, copies)
// (DeepSeek-V4: every one of its hc_mult residual streams).
struct EmbedParams {
  const bf16* table = nullptr;         // [vocab, hidden]
  const int32_t* token_ids = nullptr;  // [num_tokens], each in [0, vocab)
  int num_tokens = 0, hidden = 0;
  int copies = 1;
  float* out = nullptr;  // [num_tokens, copies, hidden]
  cudaStream_t stream = nullptr;
};

// RMSNorm of fp32 rows (the residual stream) into the bf16 input of the next
// GEMM, optionally gathering rows: for i in [0, num_rows), r = rows ? rows[i] : i,
//   y[i] = bf16(weight * (x[r] * rsqrt(mean(x[r]^2) + eps)))   (kernels/cpu RmsNorm's order)
// and the same before rounding in y_f32 when it is not null.
struct RmsNormF32Params {
  const float* x = nullptr;          // [*, ldx]
  const int32_t* rows = nullptr;     // [num_rows]; may be null (identity)
  const bf16* weight = nullptr;      // [n]
  int num_rows = 0, n = 0, ldx = 0;  // ldx 0: n
  float eps = 1e-6f;
  bf16* y = nullptr;       // [num_rows, n]
  float* y_f32 = nullptr;  // [num_rows, n]; may be null
  cudaStream_t stream = nullptr;
};

// A strided copy of one slice per (token, row):
//   dst[t * dst_token_stride + r * dst_row_stride + dst_offset + i] =
//   src[t * src_token_stride + r * src_row_stride + src_offset + i],  i in [0, dim).
// Moves each head's q_pe next to its absorbed q_nope (MLA's query row).
struct SliceCopyParams {
  const bf16* src = nullptr;
  int src_token_stride = 0, src_row_stride = 0, src_offset = 0;
  bf16* dst = nullptr;
  int dst_token_stride = 0, dst_row_stride = 0, dst_offset = 0;
  int num_tokens = 0, num_rows = 0, dim = 0;
  cudaStream_t stream = nullptr;
};

// Sorts the (token, k) routing pairs by expert, on one CTA. Afterwards
// expert e's rows are [expert_offsets[e], expert_offsets[e + 1]) of the
// permuted order, row r holds token row_token[r], and pair (t, k) sits at row
// pair_row[t * top_k + k] (-1 iff its id is outside [0, num_experts)). The
// order inside an expert is unspecified (rows are computed independently).
// tile_offsets[e] counts the tile_m-row tiles of the experts before e.
// With expert_map, ids are first mapped through it (global expert id ->
// this shard's expert, -1: not here; ids outside [0, map_size) count as -1).
struct MoePermuteParams {
  const int32_t* topk_ids = nullptr;  // [num_tokens, top_k]
  int num_tokens = 0, top_k = 0, num_experts = 0;
  const int32_t* expert_map = nullptr;  // [map_size]; may be null
  int map_size = 0;
  int tile_m = 16;
  int32_t* expert_offsets = nullptr;  // [num_experts + 1]
  int32_t* tile_offsets = nullptr;    // [num_experts + 1]
  int32_t* row_token = nullptr;       // [num_tokens * top_k]
  int32_t* pair_row = nullptr;        // [num_tokens * top_k]
  int32_t* expert_counts = nullptr;   // [num_experts]; may be null (statistics)
  cudaStream_t stream = nullptr;
};

// Grouped GEMM over the experts of one MoE layer, for the rows a
// MoePermuteParams pass laid out: for every expert e and permuted row r of e,
//   y[r, :] = x[src(r), :] · w[e]^T,  src(r) = row_index ? row_index[r] : r.
// Sizes live on the device, so a launch is graph-capturable.
struct GroupedGemmParams {
  const bf16* x = nullptr;             // [*, ldx] (or x_fp8, below)
  int ldx = 0;                         // 0: k
  const int32_t* row_index = nullptr;  // [rows]; may be null
  const bf16* w = nullptr;             // [num_experts, n, k]; or, FP8 weights:
  const uint8_t* w_fp8 = nullptr;      // e4m3 [num_experts, n, k] (exactly one of w, w_fp8, w_fp4)
  // [num_experts, Fp8Blocks(n), Fp8ScaleStride(k)]: w_fp8's 128 x 128 block
  // scales; each code times its scale is rounded to bf16 in shared memory
  // (so the same as w holding those bf16 values, bit for bit), and the MMA
  // is bf16's: weights-only FP8, which halves the bytes decode streams.
  const float* w_scale = nullptr;
  // Or MXFP4 weights (DeepSeek-V4's routed experts, kernels/cpu/mxfp4.h):
  // e2m1 pairs [num_experts, n, k / 2] (the even input in the low nibble)
  // and one ue8m0 scale per 32 inputs [num_experts, n, k / 32] (8-byte
  // aligned: a thread reads a row's scales of a slice at once); widened to
  // bf16 in registers, exactly, and summed in Mxfp4MmaInput's order within
  // each 32 inputs (so the same as w holding the dequantized values, with x
  // and w so permuted, bit for bit).
  const uint8_t* w_fp4 = nullptr;
  const uint8_t* w_mx_scale = nullptr;
  int num_experts = 0, n = 0, k = 0;
  const int32_t* expert_offsets = nullptr;  // [num_experts + 1], from MoePermuteParams
  const int32_t* tile_offsets = nullptr;    // [num_experts + 1], with the same tile_m
  int tile_m = 16;                          // 16 or 32 (decode), 64 (prefill)
  int max_tiles = 0;  // host bound on tile_offsets[num_experts]: GroupedGemmMaxTiles()
  int k_tile =
      0;  // k slice per pipeline stage: 32 or 64 (128: FP8 weights); 0: the widest k allows
  void* y = nullptr;  // [rows, ldy], per out_type
  OutType out_type = OutType::kBf16;
  int ldy = 0;  // 0: n
  cudaStream_t stream = nullptr;
  // Or, with w_fp8, FP8 activations in place of x (DeepSeek's scheme end to
  // end; grouped_gemm_fp8.cu; last here so the fields above keep their
  // offsets in the kernels' parameters): e4m3 codes [rows, ldx] in permuted order
  // (row_index null) and one scale per row per 128 columns, row r's block b at
  // x_scale[b * x_scale_ld + r] (RunQuantizeFp8's layout, with its index and
  // count for the permuted rows). The MMA is then FP8's (e4m3 x e4m3, fp32
  // sums promoted and scaled per 128-wide k block): y = dequant(x) ·
  // dequant(w)^T up to the order of the sums. REQUIRES k % 128 == 0.
  // x_fp8 holds x_scale_ld rows (the wgmma kernel's tensor map bound).
  // 64-row (prefill) tiles run on wgmma (grouped_gemm_fp8_wgmma.cu), 16 and
  // 32 on mma.sync; x_fp8_mma_sync puts 64-row tiles on mma.sync too (the
  // baseline of the wgmma kernel).
  const uint8_t* x_fp8 = nullptr;
  const float* x_scale = nullptr;
  int x_scale_ld = 0;
  bool x_fp8_mma_sync = false;
};

// out[i, :] = x[index[i], :] for i in [0, rows): an expert's rows made
// contiguous for a dense GEMM.
struct GatherRowsParams {
  const bf16* x = nullptr;         // [*, ldx]
  int ldx = 0;                     // 0: cols
  const int32_t* index = nullptr;  // [rows]
  int rows = 0, cols = 0;
  bf16* out = nullptr;  // [rows, cols]
  // > 0: x holds FP8 KV rows (cpu::Fp8KvRowLayout with this latent; ldx in
  // 2-byte units, required), each row's first cols values widened exactly
  // (its e4m3 codes times their group's scale, then its bf16 part), as
  // GatherKvRowsKernel does. REQUIRES: a multiple of 16, below cols.
  int fp8_latent = 0;
  cudaStream_t stream = nullptr;
};

// Positions [from, from + count) of one sequence in a paged latent cache
// (KvCacheDtype rows) as dense bf16 rows [latent | rope]: an FP8 row's
// latent widened exactly (its e4m3 code times its group's power-of-two
// scale, as cpu::UnpackFp8KvRow), the rope part copied. The MLA prefill's
// keys, expanded from these rows (mla_prefill.h).
struct GatherKvRowsParams {
  const bf16* cache = nullptr;  // [num_blocks, kKvBlockSize, row_stride] (2-byte units)
  KvCacheDtype dtype = KvCacheDtype::kBf16;
  int row_stride = 0;  // 0: the row's own (latent + rope, or an FP8 row's bytes / 2)
  int latent = 0, rope = 0;
  const int32_t* block_table = nullptr;  // the sequence's, each entry reached in [0, num_blocks)
  int num_blocks = 0;
  int from = 0, count = 0;
  bf16* out = nullptr;  // [count, ldo]
  int ldo = 0;          // 0: latent + rope
  cudaStream_t stream = nullptr;
};

// dst[l][dst_blocks[i]] = src[l][src_blocks[i]] for every layer l and i in
// [0, num_blocks): whole blocks of two paged KV pools (the KV handoff in
// device memory). A pool is [layers][*][block_elems] bf16.
struct CopyKvBlocksParams {
  const bf16* src = nullptr;
  int64_t src_layer_elems = 0;  // elements from one layer to the next
  bf16* dst = nullptr;
  int64_t dst_layer_elems = 0;
  int64_t block_elems = 0;
  const int32_t* src_blocks = nullptr;  // [num_blocks], device
  const int32_t* dst_blocks = nullptr;  // [num_blocks], device
  int num_blocks = 0, num_layers = 0;
  cudaStream_t stream = nullptr;
};

// x[t, :] += sum_k topk_weights[t, k] * expert_out[pair_row[t * top_k + k], :]
// (pairs with row -1 skipped; k in order), or with `overwrite` x[t, :] = the
// sum (x's old values never read: no zeroing launch before it). Null
// pair_row: pair (t, k) is row t * top_k + k; null topk_weights: every weight
// is 1 (so top_k = 1 with both null adds expert_out into x: routed outputs
// combined elsewhere).
struct MoeCombineParams {
  const float* expert_out = nullptr;    // [rows, hidden]
  const int32_t* pair_row = nullptr;    // [num_tokens * top_k]; may be null
  const float* topk_weights = nullptr;  // [num_tokens, top_k]; may be null
  int num_tokens = 0, top_k = 0, hidden = 0;
  float* x = nullptr;  // [num_tokens, hidden], in/out (out only with overwrite)
  bool overwrite = false;
  cudaStream_t stream = nullptr;
};

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_MODEL_PARAMS_H_
