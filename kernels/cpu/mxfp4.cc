#include "kernels/cpu/mxfp4.h"

#include <algorithm>
#include <cmath>

#include "base/dtype.h"

namespace moesh::cpu {
namespace {

constexpr float kE2M1Grid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

}  // namespace

float E2M1ToF32(uint8_t code) {
  const float mag = kE2M1Grid[code & 7];
  return (code & 8) ? -mag : mag;
}

uint8_t F32ToE2M1(float x) {
  if (std::isnan(x)) return 0;
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  const float a = std::fabs(x);
  uint8_t best = 7;  // saturate
  if (a < kE2M1Max) {
    // Grid points are increasing: pick the nearest; on a tie the even code.
    for (uint8_t c = 0; c < 7; ++c) {
      const float lo = kE2M1Grid[c], hi = kE2M1Grid[c + 1];
      if (a > hi) continue;
      const float mid = 0.5f * (lo + hi);
      best = a < mid ? c : (a > mid ? c + 1 : (c % 2 == 0 ? c : c + 1));
      break;
    }
  }
  return sign | best;
}

uint8_t Mxfp4ScaleFor(float amax) {
  if (!std::isfinite(amax)) return kE8M0Nan;
  if (amax == 0.0f) return 127;
  // Smallest power of two s with amax / s <= 6.
  int e = static_cast<int>(std::ceil(std::log2(static_cast<double>(amax) / kE2M1Max)));
  while (std::ldexp(static_cast<double>(kE2M1Max), e) < amax) ++e;  // log2 rounding
  while (std::ldexp(static_cast<double>(kE2M1Max), e - 1) >= amax) --e;
  return static_cast<uint8_t>(std::clamp(e + 127, 0, 254));
}

void QuantizeMxfp4(const float* w, uint8_t* packed, uint8_t* scale, int n, int k) {
  const int blocks = k / kMxfp4Block;
  for (int r = 0; r < n; ++r) {
    const float* row = w + static_cast<int64_t>(r) * k;
    uint8_t* out = packed + static_cast<int64_t>(r) * (k / 2);
    for (int b = 0; b < blocks; ++b) {
      const float* x = row + b * kMxfp4Block;
      float amax = 0.0f;
      for (int i = 0; i < kMxfp4Block; ++i) {
        amax = std::isfinite(x[i]) ? std::max(amax, std::fabs(x[i])) : INFINITY;
        if (!std::isfinite(amax)) break;
      }
      const uint8_t e = Mxfp4ScaleFor(amax);
      scale[static_cast<int64_t>(r) * blocks + b] = e;
      const float inv = e == kE8M0Nan ? 0.0f : 1.0f / E8M0ToF32(e);
      for (int i = 0; i < kMxfp4Block; i += 2) {
        const uint8_t lo = F32ToE2M1(x[i] * inv), hi = F32ToE2M1(x[i + 1] * inv);
        out[(b * kMxfp4Block + i) / 2] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  }
}

void DequantizeMxfp4(const uint8_t* packed, const uint8_t* scale, float* w, int n, int k) {
  const int blocks = k / kMxfp4Block;
  for (int r = 0; r < n; ++r) {
    const uint8_t* in = packed + static_cast<int64_t>(r) * (k / 2);
    float* row = w + static_cast<int64_t>(r) * k;
    for (int b = 0; b < blocks; ++b) {
      const float s = E8M0ToF32(scale[static_cast<int64_t>(r) * blocks + b]);
      for (int i = 0; i < kMxfp4Block; i += 2) {
        const uint8_t byte = in[(b * kMxfp4Block + i) / 2];
        row[b * kMxfp4Block + i] = E2M1ToF32(byte & 0x0F) * s;
        row[b * kMxfp4Block + i + 1] = E2M1ToF32(byte >> 4) * s;
      }
    }
  }
}

}  // namespace moesh::cpu
