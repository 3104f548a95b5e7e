#include "common/cuda_backend/forward_context.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/bf16_gemv.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8.h"

namespace moesh::cuda {
namespace {

// y[0, m) = x · w^T for an FP8 w: x quantized into (xq, xs), then the
// block-scaled GEMM (cuBLASLt's: m a multiple of four or y holding
// Fp8Rows(m) rows), or with `gemv` RunFp8Gemv (rows [0, m) only), which
// quantizes x itself up to kFp8GemvQuantizeMaxN rows of w (one launch fewer).
absl::Status Fp8Gemm(CublasGemm* gemm, const bf16* x, int ldx, const DeviceLinear& w, void* y,
                     int ldy, int m, int n, int k, OutType out, bool accumulate, uint8_t* xq,
                     float* xs, cudaStream_t stream, bool gemv = false) {
  Fp8GemmParams p;
  p.w = static_cast<const uint8_t*>(w.w), p.w_scale = w.scale;
  p.y = y, p.ldy = ldy, p.out_type = out, p.accumulate = accumulate;
  p.m = m, p.n = n, p.k = k, p.stream = stream;
  if (gemv && n <= kFp8GemvQuantizeMaxN) {
    p.x_bf16 = x, p.ldx = ldx;
    return RunFp8Gemv(p);
  }
  QuantizeFp8Params qp;
  qp.x = x, qp.ldx = ldx, qp.q = xq, qp.scale = xs, qp.m = m, qp.k = k, qp.stream = stream;
  RETURN_IF_ERROR(RunQuantizeFp8(qp));
  p.x = xq, p.x_scale = xs;
  return gemv ? RunFp8Gemv(p) : gemm->RunFp8(p);
}

}  // namespace

absl::Status ForwardContext::AllocateFp8Scratch() {
  const int k = weights->max_fp8_k(), n = weights->max_fp8_n();
  if (k == 0) return absl::OkStatus();
  const size_t rows = Fp8Rows(max_tokens), blocks = cpu::Fp8Blocks(k);
  ASSIGN_OR_RETURN(fp8.x, DeviceBuffer<uint8_t>::Create(rows * k));
  ASSIGN_OR_RETURN(fp8.x_scale, DeviceBuffer<float>::Create(rows * blocks));
  ASSIGN_OR_RETURN(fp8.tail_x, DeviceBuffer<uint8_t>::Create(size_t{4} * k));
  ASSIGN_OR_RETURN(fp8.tail_s, DeviceBuffer<float>::Create(4 * blocks));
  ASSIGN_OR_RETURN(fp8.tail_y, DeviceBuffer<float>::Create(size_t{4} * n));
  return absl::OkStatus();
}

bool ForwardContext::OnFp8Gemv(const DeviceLinear& w, int m, int k) const {
  return w.fp8() && options.fp8_gemv && m >= 1 && m <= kFp8GemvMaxRows && k % 64 == 0 &&
         k <= kFp8GemvMaxK;
}

absl::Status ForwardContext::Gemm(const bf16* x, int ldx, const DeviceLinear& w, void* y, int ldy,
                                  int m, int n, int k, OutType out, bool accumulate,
                                  cudaStream_t on) const {
  if (on != nullptr && on != stream && !OnFp8Gemv(w, m, k)) {
    return absl::InternalError(
        "ForwardContext::Gemm: only the FP8 GEMV runs off the model's stream");
  }
  if (!w.fp8())
    return Gemm(x, ldx, static_cast<const bf16*>(w.w), y, ldy, m, n, k, out, accumulate);
  if (m > max_tokens || k > weights->max_fp8_k() || n > weights->max_fp8_n()) {
    return absl::InvalidArgumentError(absl::StrCat("ForwardContext::Gemm: FP8 [", m, ", ", k,
                                                   "] x [", n, ", ", k, "] exceeds its scratch"));
  }
  if (OnFp8Gemv(w, m, k)) {
    // Decode sizes: the tensor-core GEMV straight into y (no padding, no tail).
    return Fp8Gemm(gemm, x, ldx, w, y, ldy, m, n, k, out, accumulate, fp8.x.get(),
                   fp8.x_scale.get(), on != nullptr ? on : stream, /*gemv=*/true);
  }
  const int whole = m / 4 * 4, tail = m - whole;
  if (whole > 0) {
    RETURN_IF_ERROR(Fp8Gemm(gemm, x, ldx, w, y, ldy, whole, n, k, out, accumulate, fp8.x.get(),
                            fp8.x_scale.get(), stream));
  }
  if (tail == 0) return absl::OkStatus();
  // The last rows through a four-row buffer (the GEMM writes four).
  const size_t es = out == OutType::kFloat32 ? 4 : 2;
  char* y_tail = static_cast<char*>(y) + static_cast<size_t>(whole) * ldy * es;
  if (accumulate) {
    RETURN_IF_CUDA_ERROR(cudaMemcpy2DAsync(fp8.tail_y.get(), n * es, y_tail, ldy * es, n * es, tail,
                                           cudaMemcpyDeviceToDevice, stream));
  }
  RETURN_IF_ERROR(Fp8Gemm(gemm, x + static_cast<size_t>(whole) * ldx, ldx, w, fp8.tail_y.get(), n,
                          tail, n, k, out, accumulate, fp8.tail_x.get(), fp8.tail_s.get(), stream));
  RETURN_IF_CUDA_ERROR(cudaMemcpy2DAsync(y_tail, ldy * es, fp8.tail_y.get(), n * es, n * es, tail,
                                         cudaMemcpyDeviceToDevice, stream));
  return absl::OkStatus();
}

absl::Status ForwardContext::Gemm(const bf16* x, int ldx, const bf16* w, void* y, int ldy, int m,
                                  int n, int k, OutType out, bool accumulate) const {
  GemmParams p;
  p.x = x, p.w = w, p.y = y, p.out_type = out;
  p.m = m, p.n = n, p.k = k, p.ldx = ldx, p.ldy = ldy;
  p.accumulate = accumulate;
  p.stream = stream;
  return gemm->Run(p);
}

absl::Status ForwardContext::Batched(const BatchedGemmParams& p) const {
  if (options.bf16_gemv && Bf16GemvFits(p)) return RunBf16Gemv(p);
  return gemm->RunBatched(p);
}

absl::Status ForwardContext::Mark(int index) const {
  if (profile == nullptr) return absl::OkStatus();
  return (*profile)[index].Record(stream);
}

}  // namespace moesh::cuda
