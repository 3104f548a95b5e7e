// Helpers shared by the model tests (not linked into any library code).
#ifndef MOESH_COMMON_MODEL_MODEL_TEST_UTIL_H_
#define MOESH_COMMON_MODEL_MODEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace moesh::testing_util {

// n token ids uniform in [0, vocab), reproducible from `seed`.
inline std::vector<int32_t> RandomTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = d(rng);
  return t;
}

// max_i |a[i] - b[i]| over n floats.
inline float MaxAbsDiff(const float* a, const float* b, size_t n) {
  float worst = 0.0f;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

}  // namespace moesh::testing_util

#endif  // MOESH_COMMON_MODEL_MODEL_TEST_UTIL_H_
