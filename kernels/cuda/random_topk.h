// Uniform random routing for the grouped GEMM's tests and benches: for each
// of `tokens` tokens, `top_k` distinct experts of the first `experts`, drawn
// from `rng`; [tokens * top_k], token-major. Host code, no CUDA.
#ifndef MOESH_KERNELS_CUDA_RANDOM_TOPK_H_
#define MOESH_KERNELS_CUDA_RANDOM_TOPK_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace moesh::cuda {

inline std::vector<int32_t> UniformTopkIds(int tokens, int top_k, int experts, std::mt19937& rng) {
  std::vector<int32_t> ids(static_cast<size_t>(tokens) * top_k);
  std::vector<int> pool(experts);
  for (int t = 0; t < tokens; ++t) {
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int j = 0; j < top_k; ++j) ids[static_cast<size_t>(t) * top_k + j] = pool[j];
  }
  return ids;
}

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_RANDOM_TOPK_H_
