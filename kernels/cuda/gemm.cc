#include "kernels/cuda/gemm.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/f32_gemv.h"

namespace moesh::cuda {
namespace {

absl::Status LtStatus(cublasStatus_t st, absl::string_view what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cublasLtGetStatusName(st), " (", cublasLtGetStatusString(st), ")"));
}

}  // namespace

#define RETURN_IF_LT_ERROR(expr) RETURN_IF_ERROR(LtStatus((expr), #expr))

// Column-major view: y^T[n, m] = w[k, n]^T (op T) · x^T[k, m] (op N).
struct CublasGemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (op) cublasLtMatmulDescDestroy(op);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
  }
};

absl::StatusOr<std::unique_ptr<CublasGemm>> CublasGemm::Create() {
  std::unique_ptr<CublasGemm> g(new CublasGemm());
  RETURN_IF_LT_ERROR(cublasLtCreate(&g->handle_));
  ASSIGN_OR_RETURN(g->workspace_, DeviceBuffer<uint8_t>::Create(kWorkspaceBytes));
  return g;
}

CublasGemm::~CublasGemm() {
  plans_.clear();
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

namespace {

// Largest power of two <= 256 dividing the address and every batch offset.
int AlignmentOf(const void* p, int64_t stride_bytes, int batch) {
  uintptr_t bits = reinterpret_cast<uintptr_t>(p) | 256;
  if (batch > 1) bits |= static_cast<uintptr_t>(stride_bytes);
  return static_cast<int>(bits & (~bits + 1));
}

}  // namespace

absl::StatusOr<const CublasGemm::Plan*> CublasGemm::GetPlan(const Shape& s, const float* x_scale,
                                                            const float* w_scale) {
  const Key key{s.m,
                s.n,
                s.k,
                s.ldx,
                s.ldw,
                s.ldy,
                s.batch,
                s.stride_x,
                s.stride_w,
                s.stride_y,
                s.fp32_inputs,
                static_cast<int>(s.out_type),
                s.accumulate,
                s.align_x,
                s.align_w,
                s.align_y,
                s.fp8_block_scaled,
                s.w_kn};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t in_type = s.fp8_block_scaled ? CUDA_R_8F_E4M3
                                 : s.fp32_inputs    ? CUDA_R_32F
                                                    : CUDA_R_16BF;
  const cudaDataType_t out_type = s.out_type == OutType::kFloat32 ? CUDA_R_32F : CUDA_R_16BF;
  RETURN_IF_LT_ERROR(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Column-major view: y^T [n, m] = op(A) · x^T with A the weight, stored
  // [n, k] row-major (= k x n column-major, transposed) or, w_kn, [k, n]
  // row-major (= n x k column-major, as is).
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  const cublasOperation_t op_a = s.w_kn ? no_trans : trans;
  RETURN_IF_LT_ERROR(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  RETURN_IF_LT_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                    &no_trans, sizeof(no_trans)));
  if (s.fp8_block_scaled) {
    // A is the weight (128 x 128 blocks), B the activations (1 x 128).
    const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                  b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    RETURN_IF_LT_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                                                      &a_mode, sizeof(a_mode)));
    RETURN_IF_LT_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                                                      &b_mode, sizeof(b_mode)));
    RETURN_IF_ERROR(SetFp8Scales(plan.get(), x_scale, w_scale));  // the heuristic wants them
  }
  RETURN_IF_LT_ERROR(
      cublasLtMatrixLayoutCreate(&plan->a, in_type, s.w_kn ? s.n : s.k, s.w_kn ? s.k : s.n, s.ldw));
  RETURN_IF_LT_ERROR(cublasLtMatrixLayoutCreate(&plan->b, in_type, s.k, s.m, s.ldx));
  RETURN_IF_LT_ERROR(cublasLtMatrixLayoutCreate(&plan->c, out_type, s.n, s.m, s.ldy));
  if (s.batch > 1) {
    const int32_t batch = s.batch;
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[] = {
        {plan->a, s.stride_w}, {plan->b, s.stride_x}, {plan->c, s.stride_y}};
    for (const auto& [layout, stride] : layouts) {
      RETURN_IF_LT_ERROR(cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
      RETURN_IF_LT_ERROR(cublasLtMatrixLayoutSetAttribute(
          layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }

  cublasLtMatmulPreference_t pref = nullptr;
  RETURN_IF_LT_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  // The heuristic otherwise assumes 256-byte aligned operands.
  const uint32_t align_a = s.align_w, align_b = s.align_x, align_c = s.align_y;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                       sizeof(align_a));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                       sizeof(align_b));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                       sizeof(align_c));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                       sizeof(align_c));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      handle_, plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  RETURN_IF_LT_ERROR(st);
  if (found == 0) {
    return absl::UnimplementedError(absl::StrCat("cuBLASLt has no algorithm for m=", s.m,
                                                 " n=", s.n, " k=", s.k, " batch=", s.batch));
  }
  plan->algo = result.algo;
  return (plans_[key] = std::move(plan)).get();
}

absl::Status CublasGemm::SetFp8Scales(const Plan* plan, const float* x_scale,
                                      const float* w_scale) {
  RETURN_IF_LT_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                    &w_scale, sizeof(w_scale)));
  RETURN_IF_LT_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                    &x_scale, sizeof(x_scale)));
  return absl::OkStatus();
}

absl::Status CublasGemm::Launch(const Shape& s, const void* x, const void* w, void* y,
                                cudaStream_t stream, const float* x_scale, const float* w_scale) {
  ASSIGN_OR_RETURN(const Plan* plan, GetPlan(s, x_scale, w_scale));
  // This call's scales (read when the matmul is enqueued).
  if (s.fp8_block_scaled) RETURN_IF_ERROR(SetFp8Scales(plan, x_scale, w_scale));
  const float alpha = 1.0f, beta = s.accumulate ? 1.0f : 0.0f;
  RETURN_IF_LT_ERROR(cublasLtMatmul(handle_, plan->op, &alpha, w, plan->a, x, plan->b, &beta, y,
                                    plan->c, y, plan->c, &plan->algo, workspace_.get(),
                                    kWorkspaceBytes, stream));
  return LaunchStatus("cublasLtMatmul");
}

absl::Status CublasGemm::Run(const GemmParams& p) {
  const int ldx = p.ldx ? p.ldx : p.k, ldy = p.ldy ? p.ldy : p.n;
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || ldx < p.k || ldy < p.n) {
    return absl::InvalidArgumentError("CublasGemm::Run: need m, n, k > 0, ldx >= k, ldy >= n");
  }
  if (!p.x || !p.w || !p.y) return absl::InvalidArgumentError("CublasGemm::Run: null pointer");
  if (p.k % 8 != 0 || ldx % 8 != 0 ||
      ((reinterpret_cast<uintptr_t>(p.x) | reinterpret_cast<uintptr_t>(p.w) |
        reinterpret_cast<uintptr_t>(p.y)) &
       15)) {
    return absl::InvalidArgumentError(
        "CublasGemm::Run: k and ldx must be multiples of 8, pointers 16-byte aligned");
  }
  Shape s;
  s.m = p.m, s.n = p.n, s.k = p.k, s.ldx = ldx, s.ldw = p.k, s.ldy = ldy;
  s.out_type = p.out_type;
  s.accumulate = p.accumulate;
  s.align_x = AlignmentOf(p.x, 0, 1), s.align_w = AlignmentOf(p.w, 0, 1),
  s.align_y = AlignmentOf(p.y, 0, 1);
  return Launch(s, p.x, p.w, p.y, p.stream);
}

absl::Status CublasGemm::RunBatched(const BatchedGemmParams& p) {
  const int w_cols = p.w_kn ? p.n : p.k;  // a stored weight row's values
  const int ldx = p.ldx ? p.ldx : p.k, ldw = p.ldw ? p.ldw : w_cols, ldy = p.ldy ? p.ldy : p.n;
  if (p.batch < 1 || p.m <= 0 || p.n <= 0 || p.k <= 0 || ldx < p.k || ldw < w_cols || ldy < p.n) {
    return absl::InvalidArgumentError(
        "CublasGemm::RunBatched: need batch, m, n, k > 0, ldx >= k, ldw >= k (n if w_kn), "
        "ldy >= n");
  }
  if (!p.x || !p.w || !p.y)
    return absl::InvalidArgumentError("CublasGemm::RunBatched: null pointer");
  const int out_bytes = p.out_type == OutType::kFloat32 ? 4 : 2;
  Shape s;
  s.m = p.m, s.n = p.n, s.k = p.k, s.ldx = ldx, s.ldw = ldw, s.ldy = ldy, s.batch = p.batch;
  s.stride_x = p.stride_x, s.stride_w = p.stride_w, s.stride_y = p.stride_y;
  s.w_kn = p.w_kn;
  s.out_type = p.out_type;
  s.accumulate = p.accumulate;
  s.align_x = AlignmentOf(p.x, p.stride_x * 2, p.batch);
  s.align_w = AlignmentOf(p.w, p.stride_w * 2, p.batch);
  s.align_y = AlignmentOf(p.y, p.stride_y * out_bytes, p.batch);
  if (p.k % 8 != 0 || ldx % 8 != 0 || ldw % 8 != 0 || s.align_x < 16 || s.align_w < 16 ||
      s.align_y < 16) {
    return absl::InvalidArgumentError(
        "CublasGemm::RunBatched: k, ldx, ldw must be multiples of 8; pointers and batch strides "
        "16-byte aligned");
  }
  return Launch(s, p.x, p.w, p.y, p.stream);
}

absl::Status CublasGemm::RunFp8(const Fp8GemmParams& p) {
  const int ldy = p.ldy ? p.ldy : p.n;
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || p.k % 16 != 0 || ldy < p.n) {
    return absl::InvalidArgumentError(
        absl::StrCat("CublasGemm::RunFp8: m ", p.m, ", n ", p.n, ", k ", p.k, ", ldy ", ldy,
                     ": need m, n > 0, k > 0 a multiple of 16, ldy >= n"));
  }
  if (!p.x || !p.w || !p.y || !p.x_scale || !p.w_scale)
    return absl::InvalidArgumentError("CublasGemm::RunFp8: null pointer");
  Shape s;
  s.m = Fp8Rows(p.m), s.n = p.n, s.k = p.k, s.ldx = p.k, s.ldw = p.k, s.ldy = ldy;
  s.fp8_block_scaled = true;
  s.out_type = p.out_type;
  s.accumulate = p.accumulate;
  s.align_x = AlignmentOf(p.x, 0, 1), s.align_w = AlignmentOf(p.w, 0, 1),
  s.align_y = AlignmentOf(p.y, 0, 1);
  if (s.align_x < 16 || s.align_w < 16 || s.align_y < 16 ||
      ((reinterpret_cast<uintptr_t>(p.x_scale) | reinterpret_cast<uintptr_t>(p.w_scale)) & 15)) {
    return absl::InvalidArgumentError("CublasGemm::RunFp8: pointers must be 16-byte aligned");
  }
  return Launch(s, p.x, p.w, p.y, p.stream, p.x_scale, p.w_scale);
}

absl::Status CublasGemm::RunF32(const float* x, const float* w, float* y, int m, int n, int k,
                                bool accumulate, cudaStream_t stream) {
  if (m <= 0 || n <= 0 || k <= 0)
    return absl::InvalidArgumentError("CublasGemm::RunF32: need m, n, k > 0");
  if (!x || !w || !y) return absl::InvalidArgumentError("CublasGemm::RunF32: null pointer");
  if (m <= kF32GemvMaxRows && n >= kF32GemvMinCols && k % 4 == 0) {
    // Decode sizes (the routers): one launch of our GEMV instead of
    // cuBLAS's dot kernel and reduction.
    F32GemvParams p;
    p.x = x, p.w = w, p.y = y, p.m = m, p.n = n, p.k = k, p.accumulate = accumulate;
    p.stream = stream;
    return RunF32Gemv(p);
  }
  Shape s;
  s.m = m, s.n = n, s.k = k, s.ldx = k, s.ldw = k, s.ldy = n;
  s.fp32_inputs = true;
  s.out_type = OutType::kFloat32;
  s.accumulate = accumulate;
  s.align_x = AlignmentOf(x, 0, 1), s.align_w = AlignmentOf(w, 0, 1),
  s.align_y = AlignmentOf(y, 0, 1);
  if (s.align_x < 16 || s.align_w < 16 || s.align_y < 16) {
    return absl::InvalidArgumentError("CublasGemm::RunF32: pointers must be 16-byte aligned");
  }
  return Launch(s, x, w, y, stream);
}

}  // namespace moesh::cuda
