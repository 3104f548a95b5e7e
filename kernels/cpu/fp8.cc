#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/dtype.h"

namespace moesh::cpu {
namespace {

constexpr float kMinAmax = 1e-10f;  // an all-zero block gets a tiny scale, not 0

}  // namespace

void QuantizeFp8Rows(const float* x, uint8_t* q, float* scale, int m, int k, int ldx) {
  if (ldx == 0) ldx = k;
  const int kb = Fp8Blocks(k);
  for (int i = 0; i < m; ++i) {
    const float* row = x + static_cast<size_t>(i) * ldx;
    for (int b = 0; b < kb; ++b) {
      const int c0 = b * kFp8Block, c1 = std::min(k, c0 + kFp8Block);
      float amax = kMinAmax;
      for (int c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(row[c]));
      const float s = amax / kFp8Max;
      scale[static_cast<size_t>(i) * kb + b] = s;
      for (int c = c0; c < c1; ++c) q[static_cast<size_t>(i) * k + c] = F32ToF8E4M3(row[c] / s);
    }
  }
}

void DequantizeFp8Rows(const uint8_t* q, const float* scale, float* x, int m, int k) {
  float lut[256];
  for (int c = 0; c < 256; ++c) lut[c] = F8E4M3ToF32(static_cast<uint8_t>(c));
  const int kb = Fp8Blocks(k);
  for (int i = 0; i < m; ++i) {
    const size_t row = static_cast<size_t>(i) * k;
    for (int b = 0; b < kb; ++b) {
      const float s = scale[static_cast<size_t>(i) * kb + b];
      const int c1 = std::min(k, (b + 1) * kFp8Block);
      for (int c = b * kFp8Block; c < c1; ++c) x[row + c] = lut[q[row + c]] * s;
    }
  }
}

void QuantizeFp8Blocks(const float* w, uint8_t* q, float* scale, int n, int k) {
  const int nb = Fp8Blocks(n), kb = Fp8Blocks(k);
  for (int bj = 0; bj < nb; ++bj) {
    const int r0 = bj * kFp8Block, r1 = std::min(n, r0 + kFp8Block);
    for (int b = 0; b < kb; ++b) {
      const int c0 = b * kFp8Block, c1 = std::min(k, c0 + kFp8Block);
      float amax = kMinAmax;
      for (int r = r0; r < r1; ++r) {
        for (int c = c0; c < c1; ++c)
          amax = std::max(amax, std::fabs(w[static_cast<size_t>(r) * k + c]));
      }
      const float s = amax / kFp8Max;
      scale[static_cast<size_t>(bj) * kb + b] = s;
      for (int r = r0; r < r1; ++r) {
        for (int c = c0; c < c1; ++c) {
          const size_t at = static_cast<size_t>(r) * k + c;
          q[at] = F32ToF8E4M3(w[at] / s);
        }
      }
    }
  }
}

void Fp8BlockLinear(const uint8_t* x, const float* x_scale, const uint8_t* w, const float* w_scale,
                    float* y, int m, int n, int k) {
  const int kb = Fp8Blocks(k);
  float lut[256];
  for (int c = 0; c < 256; ++c) lut[c] = F8E4M3ToF32(static_cast<uint8_t>(c));
  for (int i = 0; i < m; ++i) {
    const uint8_t* xr = x + static_cast<size_t>(i) * k;
    for (int j = 0; j < n; ++j) {
      const uint8_t* wr = w + static_cast<size_t>(j) * k;
      float acc = 0.0f;
      for (int b = 0; b < kb; ++b) {
        const int c0 = b * kFp8Block, c1 = std::min(k, c0 + kFp8Block);
        float block = 0.0f;
        for (int c = c0; c < c1; ++c) block += lut[xr[c]] * lut[wr[c]];
        acc += block * x_scale[static_cast<size_t>(i) * kb + b] *
               w_scale[static_cast<size_t>(j / kFp8Block) * kb + b];
      }
      y[static_cast<size_t>(i) * n + j] = acc;
    }
  }
}

}  // namespace moesh::cpu
