// The routed experts' MLP over the rows RunMoePermute laid out by expert —
// gate_up, SiLU·mul, down — shared by the model's own experts (CudaModel)
// and an expert worker's shard (CudaExpertStage). The caller permutes before
// and combines after.
//
// Two ways, one result (within bf16 rounding):
//  * the grouped GEMM kernel: expert offsets stay on the device, so it is
//    graph-capturable; weights-bound and fast at decode sizes;
//  * dense cuBLASLt GEMMs, one pair per expert, where the batch is large
//    (at least kDenseRowsPerExpert rows per active expert on average) and the stream
//    is not being captured: the offsets come to the host (one sync), the
//    gate_up input rows are gathered contiguous, and each expert's rows,
//    rounded up to kDenseRowAlign, run at cuBLAS's dense rate (the grouped
//    kernel reaches about 0.3 of it at prefill sizes: BENCHMARKS.md). A
//    rounded GEMM spills into the next expert's rows, which that expert's
//    GEMM (later on the stream) overwrites; the buffers carry
//    kDenseRowAlign rows of slack for the last one.
#ifndef MOESH_KERNELS_CUDA_EXPERT_MLP_H_
#define MOESH_KERNELS_CUDA_EXPERT_MLP_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

inline constexpr int kDenseRowsPerExpert = 128;
inline constexpr int kDenseRowAlign = 64;

// The tile height (ExpertMlpParams::tile_m, MoePermuteParams::tile_m) for
// `rows` permuted rows over `experts` active experts: about an expert's share
// of the rows, so that each expert's weights are streamed about once (decode)
// or reused by 64 rows (prefill).
inline int ExpertTileRows(int rows, int experts) {
  return rows <= 12 * experts ? 16 : rows <= 40 * experts ? 32 : 64;
}
// FP8 weights take FP8 activations (act_fp8 below) at tiles of this height
// only, where the wgmma FP8 x FP8 kernel runs them; shorter tiles keep the
// widening kernel, the faster there (H100: 161 against 177 us at 256 x 6
// rows, cuda_model_bench's grouped GEMM table).
inline constexpr int kFp8ActivationTileRows = 64;
// Whether FP8 expert weights of these widths can take FP8 activations: whole
// 128-column blocks (DeepSeek's shapes); other widths keep the widening kernel.
inline bool Fp8ActivationWidths(int hidden, int inter) {
  return hidden % cpu::kFp8Block == 0 && inter % cpu::kFp8Block == 0;
}
// The elements of act_fp8 and act_fp8_scale (below) for up to `rows` permuted rows.
inline size_t Fp8ActivationCodes(int rows, int hidden, int inter) {
  return static_cast<size_t>(Fp8Rows(rows)) * std::max(hidden, inter);
}
inline size_t Fp8ActivationScales(int rows, int hidden, int inter) {
  return static_cast<size_t>(Fp8Rows(rows)) * cpu::Fp8Blocks(std::max(hidden, inter));
}

struct ExpertMlpParams {
  const bf16* x = nullptr;  // [*, ldx]: the normalised hidden states
  int ldx = 0;
  const int32_t* row_token = nullptr;       // [rows]: x's row of each permuted row
  const int32_t* expert_offsets = nullptr;  // [num_experts + 1], device
  const int32_t* tile_offsets = nullptr;    // [num_experts + 1], device, for tile_m
  int tile_m = 16;
  int rows = 0;            // permuted rows, or a host bound on them (a serve mask drops pairs)
  int expected_rows = 0;   // the rows expected here (picks the path); 0: rows
  int active_experts = 0;  // the experts they spread over; 0: num_experts
  const bf16* gate_up = nullptr;  // [num_experts, 2 * inter, hidden]
  const bf16* down = nullptr;     // [num_experts, hidden, inter]
  // Or FP8 weights (GroupedGemmParams::w_fp8; both or neither): e4m3 codes
  // of the shapes above, scales [num_experts, Fp8Blocks(n), Fp8ScaleStride(k)].
  // They always take the grouped kernel.
  const uint8_t* gate_up_fp8 = nullptr;
  const float* gate_up_scale = nullptr;
  const uint8_t* down_fp8 = nullptr;
  const float* down_scale = nullptr;
  // Or MXFP4 weights (GroupedGemmParams::w_fp4; both or neither): e2m1 pairs
  // [num_experts, n, k / 2] and ue8m0 scales [num_experts, n, k / 32] of the
  // shapes above. They always take the grouped kernel too.
  const uint8_t* gate_up_fp4 = nullptr;
  const uint8_t* gate_up_mx_scale = nullptr;
  const uint8_t* down_fp4 = nullptr;
  const uint8_t* down_mx_scale = nullptr;
  int num_experts = 0, hidden = 0, inter = 0;
  float swiglu_limit = 0.0f;  // > 0: the activation's clamp (DeepSeek-V4)
  // FP8 weights only: with this scratch set, both GEMMs take FP8 activations
  // too (GroupedGemmParams::x_fp8; CudaModelOptions::fp8_expert_act): the
  // permuted rows of x, then the SiLU·mul output, quantized per row and 128
  // columns (RunQuantizeFp8, bit for bit kernels/cpu/fp8.h's QuantizeFp8Rows)
  // into codes [Fp8Rows(rows), max(hidden, inter)] and scales
  // [Fp8Blocks(max(hidden, inter)), Fp8Rows(rows)]. REQUIRES hidden and inter
  // multiples of 128.
  uint8_t* act_fp8 = nullptr;
  float* act_fp8_scale = nullptr;
  // Scratch, each with rows + kDenseRowAlign rows.
  bf16* gathered = nullptr;         // [*, hidden]
  bf16* gu = nullptr;               // [*, 2 * inter]
  bf16* act = nullptr;              // [*, inter]
  float* y = nullptr;               // [*, hidden]: the output, per permuted row
  int32_t* host_offsets = nullptr;  // pinned [num_experts + 1]
  CublasGemm* gemm = nullptr;
  cudaStream_t stream = nullptr;
};

absl::Status EnqueueExpertMlp(const ExpertMlpParams& p);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_EXPERT_MLP_H_
