#include "kernels/cuda/expert_mlp.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/ops.h"

namespace moesh::cuda {
namespace {

bool Capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) != cudaSuccess) {
    cudaGetLastError();  // not left for the next launch's check to report
    return true;         // (the grouped path is safe either way)
  }
  return st != cudaStreamCaptureStatusNone;
}

// act = SiLU(gate) * up over `rows` rows of gu (V4's clamp where set).
absl::Status SiluAndMul(const ExpertMlpParams& p, int rows) {
  SiluAndMulParams sp;
  sp.gate_up = p.gu, sp.out = p.act, sp.m = rows, sp.i = p.inter, sp.stream = p.stream,
  sp.limit = p.swiglu_limit;
  return RunSiluAndMul(sp);
}

absl::Status Dense(const ExpertMlpParams& p) {
  const int e = p.num_experts, h = p.hidden, inter = p.inter;
  cudaStream_t s = p.stream;
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(p.host_offsets, p.expert_offsets, (e + 1) * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, s));
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(s));
  const int32_t* off = p.host_offsets;
  const int rows = off[e];
  if (rows < 0 || rows > p.rows) {
    return absl::InternalError(
        absl::StrCat("expert MLP: ", rows, " permuted rows, more than the bound ", p.rows));
  }
  GatherRowsParams gp;
  gp.x = p.x, gp.ldx = p.ldx, gp.index = p.row_token, gp.rows = rows, gp.cols = h,
  gp.out = p.gathered, gp.stream = s;
  RETURN_IF_ERROR(RunGatherRows(gp));
  auto rounded = [&](int ex) {
    const int m = off[ex + 1] - off[ex];
    return (m + kDenseRowAlign - 1) / kDenseRowAlign * kDenseRowAlign;
  };
  for (int ex = 0; ex < e; ++ex) {  // ascending: each spill is overwritten by a later expert
    if (off[ex + 1] == off[ex]) continue;
    GemmParams g;
    g.x = p.gathered + static_cast<size_t>(off[ex]) * h,
    g.w = p.gate_up + static_cast<size_t>(ex) * 2 * inter * h;
    g.y = p.gu + static_cast<size_t>(off[ex]) * 2 * inter, g.m = rounded(ex), g.n = 2 * inter,
    g.k = h, g.stream = s;
    RETURN_IF_ERROR(p.gemm->Run(g));
  }
  RETURN_IF_ERROR(SiluAndMul(p, rows));
  for (int ex = 0; ex < e; ++ex) {
    if (off[ex + 1] == off[ex]) continue;
    GemmParams g;
    g.x = p.act + static_cast<size_t>(off[ex]) * inter,
    g.w = p.down + static_cast<size_t>(ex) * h * inter;
    g.y = p.y + static_cast<size_t>(off[ex]) * h, g.out_type = OutType::kFloat32, g.m = rounded(ex),
    g.n = h;
    g.k = inter, g.stream = s;
    RETURN_IF_ERROR(p.gemm->Run(g));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EnqueueExpertMlp(const ExpertMlpParams& p) {
  const int e = p.num_experts, h = p.hidden, inter = p.inter;
  if (p.rows == 0) return absl::OkStatus();
  const bool fp8 = p.gate_up_fp8 != nullptr, fp4 = p.gate_up_fp4 != nullptr;
  if (fp8 != (p.down_fp8 != nullptr) || fp4 != (p.down_fp4 != nullptr)) {
    return absl::InvalidArgumentError("EnqueueExpertMlp: FP8 (MXFP4) gate_up and down go together");
  }
  if (!fp8 && !fp4 && p.gathered != nullptr && p.host_offsets != nullptr && p.gemm != nullptr &&
      static_cast<int64_t>(p.expected_rows > 0 ? p.expected_rows : p.rows) >=
          static_cast<int64_t>(kDenseRowsPerExpert) *
              (p.active_experts > 0 ? p.active_experts : e) &&
      !Capturing(p.stream)) {
    return Dense(p);
  }
  if ((p.act_fp8 != nullptr) != (p.act_fp8_scale != nullptr) || (p.act_fp8 != nullptr && !fp8)) {
    return absl::InvalidArgumentError(
        "EnqueueExpertMlp: FP8 activations need both scratch buffers and FP8 weights");
  }
  // FP8 activations: each GEMM's input quantized on the way in (the permuted
  // rows through row_token, then the SiLU·mul output into the same scratch),
  // up to the pass's real row count on the device.
  const bool fp8_act = p.act_fp8 != nullptr;
  QuantizeFp8Params qp;
  qp.count = p.expert_offsets + e, qp.q = p.act_fp8, qp.scale = p.act_fp8_scale, qp.m = p.rows;
  qp.stream = p.stream;
  GroupedGemmParams gg;
  if (fp8_act) {
    qp.x = p.x, qp.ldx = p.ldx, qp.index = p.row_token, qp.k = h;
    RETURN_IF_ERROR(RunQuantizeFp8(qp));
    gg.x_fp8 = p.act_fp8, gg.ldx = h, gg.x_scale = p.act_fp8_scale;
    gg.x_scale_ld = Fp8Rows(p.rows);
  } else {
    gg.x = p.x, gg.ldx = p.ldx, gg.row_index = p.row_token;
  }
  gg.w = p.gate_up, gg.w_fp8 = p.gate_up_fp8, gg.w_scale = p.gate_up_scale;
  gg.w_fp4 = p.gate_up_fp4, gg.w_mx_scale = p.gate_up_mx_scale;
  gg.num_experts = e, gg.n = 2 * inter, gg.k = h;
  gg.expert_offsets = p.expert_offsets, gg.tile_offsets = p.tile_offsets;
  gg.tile_m = p.tile_m, gg.max_tiles = GroupedGemmMaxTiles(p.rows, e, p.tile_m);
  gg.y = p.gu, gg.out_type = OutType::kBf16, gg.ldy = 2 * inter, gg.stream = p.stream;
  RETURN_IF_ERROR(RunGroupedGemm(gg));
  // Over every row the pairs could fill; rows past the pairs are never read.
  RETURN_IF_ERROR(SiluAndMul(p, p.rows));
  if (fp8_act) {
    qp.x = p.act, qp.ldx = inter, qp.index = nullptr, qp.k = inter;
    RETURN_IF_ERROR(RunQuantizeFp8(qp));
    gg.ldx = inter;
  } else {
    gg.x = p.act, gg.ldx = inter, gg.row_index = nullptr;
  }
  gg.w = p.down, gg.w_fp8 = p.down_fp8, gg.w_scale = p.down_scale;
  gg.w_fp4 = p.down_fp4, gg.w_mx_scale = p.down_mx_scale;
  gg.n = h, gg.k = inter;
  gg.y = p.y, gg.out_type = OutType::kFloat32, gg.ldy = h;
  return RunGroupedGemm(gg);
}

}  // namespace moesh::cuda
