// Elementwise and row-wise CUDA ops: RMSNorm (plain and fused with the
// residual add), RoPE (in place, and fused with the paged latent-cache write),
// SiLU-and-mul. Same semantics as kernels/cpu (ops.h, rope.h) on bf16 data.
//
// Each entry point checks shapes once, launches on params.stream and returns
// INVALID_ARGUMENT for bad arguments or INTERNAL carrying the CUDA error. All
// are asynchronous: errors of the kernel's execution surface at a later sync.
#ifndef MOESH_KERNELS_CUDA_OPS_H_
#define MOESH_KERNELS_CUDA_OPS_H_

#include "absl/status/status.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

absl::Status RunRmsNorm(const RmsNormParams& p);
absl::Status RunAddRmsNorm(const AddRmsNormParams& p);

absl::Status RunRope(const RopeParams& p);
absl::Status RunRopeKvCacheWrite(const RopeKvCacheParams& p);

absl::Status RunSiluAndMul(const SiluAndMulParams& p);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_OPS_H_
