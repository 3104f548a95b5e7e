// Dense GEMMs through cuBLASLt: y[m, n] = x[m, k] · w[n, k]^T (nn.Linear's
// layout), bf16 operands, fp32 accumulation, bf16 or fp32 output; the same
// strided-batched (one GEMM per head, e.g. MLA's absorbed W_UK / W_UV), and a
// plain fp32 GEMM (the MoE router, which DeepSeek computes in fp32).
#ifndef MOESH_KERNELS_CUDA_GEMM_H_
#define MOESH_KERNELS_CUDA_GEMM_H_

#include <cublasLt.h>

#include <array>
#include <map>
#include <memory>

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

  // batch GEMMs y_b = x_b · w_b^T with x_b = x + b * stride_x (elements), etc.
  // REQUIRES: as Run, plus batch >= 1 and strides keeping 16-byte alignment.
  absl::Status RunBatched(const BatchedGemmParams& p);

  // y[m, n] = x[m, k] · w[n, k]^T (+ y if accumulate), all fp32, fp32 math
  // (no TF32). REQUIRES: m, n, k > 0; 16-byte aligned pointers.
  absl::Status RunF32(const float* x, const float* w, float* y, int m, int n, int k,
                      bool accumulate, cudaStream_t stream);

 private:
  struct Plan;
  struct Shape {
    int m = 0, n = 0, k = 0, ldx = 0, ldw = 0, ldy = 0;
    int batch = 1;
    int64_t stride_x = 0, stride_w = 0, stride_y = 0;
    bool fp32_inputs = false;
    OutType out_type = OutType::kBf16;
    bool accumulate = false;
    int align_x = 16, align_w = 16, align_y = 16;  // bytes, powers of two <= 256
  };
  using Key = std::array<int64_t, 16>;

  CublasGemm() = default;
  absl::StatusOr<const Plan*> GetPlan(const Shape& s);
  absl::Status Launch(const Shape& s, const void* x, const void* w, void* y, cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<uint8_t> workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_GEMM_H_
