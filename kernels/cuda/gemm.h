// Dense GEMMs through cuBLASLt: y[m, n] = x[m, k] · w[n, k]^T (nn.Linear's
// layout), bf16 operands, fp32 accumulation, bf16 or fp32 output.
#ifndef MOESH_KERNELS_CUDA_GEMM_H_
#define MOESH_KERNELS_CUDA_GEMM_H_

#include <cublasLt.h>

#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

// Owns a cuBLASLt handle, its workspace and a cache of the heuristic's
// algorithm per shape. Not thread-safe: one per stream-owning thread.
class CublasGemm {
 public:
  static constexpr size_t kWorkspaceBytes = 32u << 20;

  static absl::StatusOr<std::unique_ptr<CublasGemm>> Create();
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // REQUIRES (else INVALID_ARGUMENT): m, n, k > 0, ldx >= k, ldy >= n; 16-byte
  // aligned pointers and ldx, k multiples of 8 (cuBLASLt's bf16 fast paths).
  absl::Status Run(const GemmParams& p);

 private:
  struct Plan;
  using Key = std::tuple<int, int, int, int, int, int, bool>;  // m n k ldx ldy out acc

  CublasGemm() = default;
  absl::StatusOr<const Plan*> GetPlan(const GemmParams& p, int ldx, int ldy);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<uint8_t> workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_GEMM_H_
