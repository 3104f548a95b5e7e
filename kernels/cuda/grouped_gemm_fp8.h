// The grouped expert GEMM with FP8 activations and FP8 weights
// (GroupedGemmParams::x_fp8), launched by RunGroupedGemm (model_ops.h) once
// it has checked the arguments; not called directly.
#ifndef MOESH_KERNELS_CUDA_GROUPED_GEMM_FP8_H_
#define MOESH_KERNELS_CUDA_GROUPED_GEMM_FP8_H_

#include "absl/status/status.h"
#include "kernels/cuda/model_params.h"

namespace moesh::cuda {

// REQUIRES (checked by RunGroupedGemm): x_fp8, x_scale, w_fp8, w_scale set,
// x, w, w_fp4 and row_index null, k % 128 == 0, ldx >= k a multiple of 16,
// x_fp8 and w_fp8 16-byte aligned, tile_m 16, 32 or 64. And (the caller's:
// the real row count lives on the device) x_fp8 and x_scale hold x_scale_ld
// >= the permuted rows.
absl::Status LaunchGroupedGemmFp8(const GroupedGemmParams& p);
// The same at 64-row tiles on wgmma (grouped_gemm_fp8_wgmma.cu), which
// LaunchGroupedGemmFp8 calls for them unless x_fp8_mma_sync.
absl::Status LaunchGroupedGemmFp8Wgmma(const GroupedGemmParams& p);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_GROUPED_GEMM_FP8_H_
