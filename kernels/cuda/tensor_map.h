// Tensor maps for the Hopper copy engine (TMA, async_copy.cuh's TmaLoad2D):
// a 2-D bf16 matrix read in 64 x 64 boxes (64 columns = 128 bytes, one SW128
// column block of wgmma.cuh), swizzled by the copy engine, elements outside
// the matrix read as zeros. Host code; encoded through the runtime's driver
// entry point (no -lcuda).
#ifndef MOESH_KERNELS_CUDA_TENSOR_MAP_H_
#define MOESH_KERNELS_CUDA_TENSOR_MAP_H_

#include <cuda.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moesh::cuda {

// [rows, cols] bf16 at `base`, rows `ld` elements apart. REQUIRES (else
// INVALID_ARGUMENT naming `what`): a 16-byte aligned base, ld a multiple of 8
// and >= cols, rows and cols >= 1. INTERNAL if the driver refuses it.
absl::StatusOr<CUtensorMap> Bf16BoxMap64(const void* base, uint64_t rows, uint64_t cols,
                                         uint64_t ld, absl::string_view what);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_TENSOR_MAP_H_
