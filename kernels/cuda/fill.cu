#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fill.h"

namespace moesh::cuda {
namespace {

__device__ __forceinline__ float Uniform(uint64_t seed, uint64_t i, float scale) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;  // splitmix64
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return (static_cast<float>(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * scale;
}

template <typename T>
__global__ void FillKernel(T* x, size_t n, uint64_t seed, float scale, float offset) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    x[i] = static_cast<T>(offset + Uniform(seed, i, scale));
  }
}

template <typename T>
absl::Status Fill(T* x, size_t n, uint64_t seed, float scale, float offset, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  if (x == nullptr) return absl::InvalidArgumentError("FillUniform: null pointer");
  const size_t blocks = std::min<size_t>((n + 255) / 256, 65536);
  FillKernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(x, n, seed, scale, offset);
  return LaunchStatus("FillKernel");
}

}  // namespace

absl::Status FillUniform(bf16* x, size_t n, uint64_t seed, float scale, cudaStream_t stream) {
  return Fill(x, n, seed, scale, 0.0f, stream);
}
absl::Status FillUniform(float* x, size_t n, uint64_t seed, float scale, cudaStream_t stream) {
  return Fill(x, n, seed, scale, 0.0f, stream);
}
absl::Status FillUniform(bf16* x, size_t n, uint64_t seed, float scale, float offset,
                         cudaStream_t stream) {
  return Fill(x, n, seed, scale, offset, stream);
}
absl::Status FillUniform(float* x, size_t n, uint64_t seed, float scale, float offset,
                         cudaStream_t stream) {
  return Fill(x, n, seed, scale, offset, stream);
}

}  // namespace moesh::cuda
