// Helpers of the CUDA op tests: device presence, bf16 on the host, random
// inputs, poisoned outputs and relative errors.
#ifndef MOESH_KERNELS_CUDA_TEST_UTIL_H_
#define MOESH_KERNELS_CUDA_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda::testing {

// tests/golden/<name> of $MOESH_SOURCE_DIR (the device runs set it: the
// checkout lives elsewhere there), else of the source tree this was built from.
inline std::string GoldenDir(const std::string& name) {
  const char* env = std::getenv("MOESH_SOURCE_DIR");
  return std::string(env != nullptr ? env : MOESH_PROJECT_DIR) + "/tests/golden/" + name;
}

// Skips the test iff no CUDA device is present; with MOESH_REQUIRE_CUDA=1 in
// the environment (the device-machine runs) a missing device fails instead.
#define MOESH_REQUIRE_GPU()                                                               \
  do {                                                                                    \
    const absl::StatusOr<int> n_ = ::moesh::cuda::CudaDeviceCount();                      \
    ASSERT_TRUE(n_.ok()) << n_.status();                                                  \
    if (*n_ == 0) {                                                                       \
      if (std::getenv("MOESH_REQUIRE_CUDA") != nullptr) FAIL() << "no CUDA device found"; \
      GTEST_SKIP() << "no CUDA device (no driver or no GPU here): GPU test skipped";      \
    }                                                                                     \
  } while (0)

#define MOESH_ASSERT_OK(expr)                      \
  do {                                             \
    const absl::Status st_ = (expr);               \
    ASSERT_TRUE(st_.ok()) << #expr << ": " << st_; \
  } while (0)

#define MOESH_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  MOESH_ASSERT_OK_AND_ASSIGN_IMPL_(MOESH_CONCAT_(sor_, __LINE__), lhs, expr)
#define MOESH_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, expr)  \
  auto tmp = (expr);                                      \
  ASSERT_TRUE(tmp.ok()) << #expr << ": " << tmp.status(); \
  lhs = std::move(tmp).value()

inline bf16 ToBf16(float f) {
  __nv_bfloat16_raw r;
  r.x = F32ToBf16(f);
  return bf16(r);
}

inline float ToFloat(bf16 b) { return Bf16ToF32(static_cast<__nv_bfloat16_raw>(b).x); }

inline float RoundBf16(float f) { return Bf16ToF32(F32ToBf16(f)); }

// A fresh seed per call (printed by the caller's SCOPED_TRACE for reruns).
inline uint32_t FreshSeed() {
  static std::random_device rd;
  return rd();
}

inline std::vector<float> Randn(size_t n, std::mt19937& rng, float stddev = 1.0f,
                                float mean = 0.0f) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// bf16 copies of `v`; `v` itself is rounded to the values the device sees.
inline std::vector<bf16> ToBf16Rounding(std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = ToBf16(v[i]);
    v[i] = ToFloat(out[i]);
  }
  return out;
}

inline std::vector<float> ToFloats(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = ToFloat(v[i]);
  return out;
}

template <typename T>
absl::StatusOr<DeviceBuffer<T>> Upload(const std::vector<T>& host) {
  ASSIGN_OR_RETURN(DeviceBuffer<T> d, DeviceBuffer<T>::Create(host.size()));
  RETURN_IF_ERROR(d.CopyFrom(host));
  return d;
}

// Multiplies each 128-value group (an FP8 KV scale's group) of the first
// `latent` values of each of `num_rows` rows of `ld` floats by 2^k, k uniform
// in [-6, 6], so that an FP8 row's groups get different scales: a scale read
// from the wrong group or row shows.
inline void ScaleFp8Groups(float* rows, size_t num_rows, int ld, int latent, std::mt19937& rng) {
  constexpr int kGroup = cpu::kFp8Block;
  std::uniform_int_distribution<int> exponent(-6, 6);
  for (size_t r = 0; r < num_rows; ++r) {
    for (int g = 0; g * kGroup < latent; ++g) {
      const float f = std::ldexp(1.0f, exponent(rng));
      for (int c = g * kGroup; c < std::min(latent, (g + 1) * kGroup); ++c) rows[r * ld + c] *= f;
    }
  }
}

// Fills the buffer with NaN (0xff bytes: a NaN in bf16 and fp32, -1 in int32).
template <typename T>
absl::Status Poison(DeviceBuffer<T>& d) {
  return CudaStatus(cudaMemset(d.get(), 0xff, d.bytes()), "cudaMemset");
}

// ||out - ref|| / ||ref||; +inf if out has a non-finite element where ref has none.
inline double RelErr(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(out[i])) return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(out[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace moesh::cuda::testing

#endif  // MOESH_KERNELS_CUDA_TEST_UTIL_H_
