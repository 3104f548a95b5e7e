#include "kernels/cuda/gemm.h"

#include "absl/strings/str_cat.h"

namespace moesh::cuda {
namespace {

absl::Status LtStatus(cublasStatus_t st, absl::string_view what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cublasLtGetStatusName(st), " (", cublasLtGetStatusString(st), ")"));
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

absl::StatusOr<const CublasGemm::Plan*> CublasGemm::GetPlan(const GemmParams& p, int ldx, int ldy) {
  const Key key{p.m, p.n, p.k, ldx, ldy, static_cast<int>(p.out_type), p.accumulate};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t out_type = p.out_type == OutType::kFloat32 ? CUDA_R_32F : CUDA_R_16BF;
  RETURN_IF_LT_ERROR(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
  RETURN_IF_LT_ERROR(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
  RETURN_IF_LT_ERROR(
      cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans, sizeof(no_trans)));
  RETURN_IF_LT_ERROR(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, p.k, p.n, p.k));
  RETURN_IF_LT_ERROR(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, p.k, p.m, ldx));
  RETURN_IF_LT_ERROR(cublasLtMatrixLayoutCreate(&plan->c, out_type, p.n, p.m, ldy));

  cublasLtMatmulPreference_t pref = nullptr;
  RETURN_IF_LT_ERROR(cublasLtMatmulPreferenceCreate(&pref));
  const size_t ws = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, plan->op, plan->a, plan->b, plan->c,
                                                           plan->c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  RETURN_IF_LT_ERROR(st);
  if (found == 0) {
    return absl::UnimplementedError(absl::StrCat("cuBLASLt has no algorithm for m=", p.m, " n=", p.n, " k=", p.k));
  }
  plan->algo = result.algo;
  return (plans_[key] = std::move(plan)).get();
}

absl::Status CublasGemm::Run(const GemmParams& p) {
  const int ldx = p.ldx ? p.ldx : p.k, ldy = p.ldy ? p.ldy : p.n;
  if (p.m <= 0 || p.n <= 0 || p.k <= 0 || ldx < p.k || ldy < p.n) {
    return absl::InvalidArgumentError("CublasGemm::Run: need m, n, k > 0, ldx >= k, ldy >= n");
  }
  if (!p.x || !p.w || !p.y) return absl::InvalidArgumentError("CublasGemm::Run: null pointer");
  if (p.k % 8 != 0 || ldx % 8 != 0 || ((reinterpret_cast<uintptr_t>(p.x) | reinterpret_cast<uintptr_t>(p.w) |
                                         reinterpret_cast<uintptr_t>(p.y)) & 15)) {
    return absl::InvalidArgumentError("CublasGemm::Run: k and ldx must be multiples of 8, pointers 16-byte aligned");
  }
  ASSIGN_OR_RETURN(const Plan* plan, GetPlan(p, ldx, ldy));
  const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  RETURN_IF_LT_ERROR(cublasLtMatmul(handle_, plan->op, &alpha, p.w, plan->a, p.x, plan->b, &beta, p.y, plan->c,
                                    p.y, plan->c, &plan->algo, workspace_.get(), kWorkspaceBytes, p.stream));
  return LaunchStatus("cublasLtMatmul");
}

}  // namespace moesh::cuda
