// Dense GEMMs through cuBLASLt: y[m, n] = x[m, k] · w[n, k]^T (nn.Linear's
// layout), bf16 operands, fp32 accumulation, bf16 or fp32 output; the same
// strided-batched (one GEMM per head, e.g. MLA's absorbed W_UK / W_UV), and a
// plain fp32 GEMM (the MoE router, which DeepSeek computes in fp32); and
// DeepSeek's block-scaled FP8 GEMM (cuBLASLt's 128 x 128 block scales for the
// weight, 1 x 128 for the activations; Hopper and CUDA 12.9 up).
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

  // batch GEMMs y_b = x_b · w_b^T (x_b · w_b if w_kn) with x_b = x + b * stride_x
  // (elements; stride 0 repeats x), etc.
  // REQUIRES: as Run, plus batch >= 1 and strides keeping 16-byte alignment.
  absl::Status RunBatched(const BatchedGemmParams& p);

  // Fp8GemmParams' block-scaled FP8 GEMM (over Fp8Rows(m) rows). REQUIRES
  // (else INVALID_ARGUMENT): m, n > 0, k > 0 a multiple of 16, ldy >= n,
  // 16-byte aligned pointers. An error from cuBLASLt where it has no kernel
  // for it (before Hopper).
  absl::Status RunFp8(const Fp8GemmParams& p);

  // y[m, n] = x[m, k] · w[n, k]^T (+ y if accumulate), all fp32, fp32 math
  // (no TF32). REQUIRES: m, n, k > 0; 16-byte aligned pointers. Up to
  // kF32GemvMaxRows rows (k a multiple of 4) on RunF32Gemv, not cuBLAS.
  absl::Status RunF32(const float* x, const float* w, float* y, int m, int n, int k,
                      bool accumulate, cudaStream_t stream);

 private:
  struct Plan;
  struct Shape {
    int m = 0, n = 0, k = 0, ldx = 0, ldw = 0, ldy = 0;
    int batch = 1;
    int64_t stride_x = 0, stride_w = 0, stride_y = 0;
    bool fp32_inputs = false;
    bool fp8_block_scaled = false;  // e4m3 inputs, Fp8GemmParams' scales
    bool w_kn = false;              // w stored [k, n] (BatchedGemmParams::w_kn)
    OutType out_type = OutType::kBf16;
    bool accumulate = false;
    int align_x = 16, align_w = 16, align_y = 16;  // bytes, powers of two <= 256
  };
  using Key = std::array<int64_t, 18>;

  CublasGemm() = default;
  // x_scale, w_scale: the FP8 GEMM's (cuBLASLt's heuristic needs them set).
  absl::StatusOr<const Plan*> GetPlan(const Shape& s, const float* x_scale = nullptr,
                                      const float* w_scale = nullptr);
  static absl::Status SetFp8Scales(const Plan* plan, const float* x_scale, const float* w_scale);
  // x_scale, w_scale: the FP8 GEMM's (null otherwise).
  absl::Status Launch(const Shape& s, const void* x, const void* w, void* y, cudaStream_t stream,
                      const float* x_scale = nullptr, const float* w_scale = nullptr);

  cublasLtHandle_t handle_ = nullptr;
  DeviceBuffer<uint8_t> workspace_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_GEMM_H_
