// Random fills on the device, for benchmarks and dummy weights: never zeros,
// which hide unwritten outputs and can run faster than real data.
#ifndef MOESH_KERNELS_CUDA_FILL_H_
#define MOESH_KERNELS_CUDA_FILL_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

// x[i] = uniform in [-scale, scale), a pure function of (seed, i).
absl::Status FillUniform(bf16* x, size_t n, uint64_t seed, float scale, cudaStream_t stream);
absl::Status FillUniform(float* x, size_t n, uint64_t seed, float scale, cudaStream_t stream);
// x[i] = offset + uniform in [-scale, scale) (e.g. norm weights near 1).
absl::Status FillUniform(bf16* x, size_t n, uint64_t seed, float scale, float offset,
                         cudaStream_t stream);
absl::Status FillUniform(float* x, size_t n, uint64_t seed, float scale, float offset,
                         cudaStream_t stream);

// `num_rows` FP8 KV rows (KvCacheDtype::kFp8: cpu::Fp8KvRowLayout{latent,
// rope}, rows of layout.bytes()) holding what cpu::PackFp8KvRow makes of
// uniform values in [-scale, scale): codes e4m3(u / s) with each group's
// scale s = Fp8KvScale(scale), rope uniform in bf16; a pure function of
// (seed, row, column). REQUIRES: latent a positive multiple of 16.
absl::Status FillFp8KvRows(void* rows, size_t num_rows, int latent, int rope, uint64_t seed,
                           float scale, cudaStream_t stream);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_FILL_H_
