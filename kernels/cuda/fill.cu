#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/fp8_kv.cuh"

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

__global__ void FillFp8KvKernel(uint8_t* rows, size_t num_rows, cpu::Fp8KvRowLayout layout,
                                uint64_t seed, float scale) {
  const float s = fp8kv::Scale(scale);
  const int width = layout.latent + layout.rope, bytes = layout.bytes();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < num_rows * bytes;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / bytes;
    const int b = static_cast<int>(i % bytes);
    uint8_t v = 0;  // padding
    if (b < layout.latent) {
      v = fp8kv::Code(Uniform(seed, r * width + b, scale), s);
    } else if (b < layout.rope_offset()) {  // the scales, a byte at a time
      const float sc = s;
      v = reinterpret_cast<const uint8_t*>(&sc)[(b - layout.scales_offset()) % 4];
    } else if (b < layout.rope_offset() + 2 * layout.rope) {
      const int c = (b - layout.rope_offset()) / 2;
      const __nv_bfloat16 x =
          __float2bfloat16_rn(Uniform(seed, r * width + layout.latent + c, scale));
      v = reinterpret_cast<const uint8_t*>(&x)[(b - layout.rope_offset()) % 2];
    }
    rows[i] = v;
  }
}

}  // namespace

absl::Status FillFp8KvRows(void* rows, size_t num_rows, int latent, int rope, uint64_t seed,
                           float scale, cudaStream_t stream) {
  if (latent < 16 || latent % 16 != 0 || rope < 0 || rope % 2 != 0) {
    return absl::InvalidArgumentError("FillFp8KvRows: latent a multiple of 16, rope even");
  }
  if (num_rows == 0) return absl::OkStatus();
  if (rows == nullptr) return absl::InvalidArgumentError("FillFp8KvRows: null pointer");
  const cpu::Fp8KvRowLayout layout{latent, rope};
  const size_t blocks = std::min<size_t>((num_rows * layout.bytes() + 255) / 256, 65536);
  FillFp8KvKernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(static_cast<uint8_t*>(rows),
                                                                     num_rows, layout, seed, scale);
  return LaunchStatus("FillFp8KvKernel");
}

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
