// MXFP4 on the GPU (DeepSeek-V4's routed experts): quantizing weights at load
// where the host's copy would cost too much (dummy weights of real-size
// models). The grouped GEMM reads the format (GroupedGemmParams::w_fp4).
// Reference: kernels/cpu/mxfp4.h, which this matches bit for bit.
#ifndef MOESH_KERNELS_CUDA_MXFP4_H_
#define MOESH_KERNELS_CUDA_MXFP4_H_

#include "absl/status/status.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

// INVALID_ARGUMENT unless n > 0, k > 0 a multiple of 32, w, q and scale set.
absl::Status RunQuantizeMxfp4(const QuantizeMxfp4Params& p);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_MXFP4_H_
