#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "base/dtype.h"
#include "base/fp8_e4m3.h"

namespace moesh::cpu {
namespace {

// max(kFp8MinAmax, max |x[c]|) over n values, NaNs skipped (std::max(amax,
// NaN) keeps amax): on the bits as int32, whose order is the magnitudes'
// for non-NaN floats, so the loop vectorises without -ffast-math (with a
// constant trip count for a full block: GCC's -O2 cost model).
template <int kN>
inline int32_t AmaxBits(const float* x, int n, int32_t best) {
  const int count = kN > 0 ? kN : n;
  for (int c = 0; c < count; ++c) {
    const int32_t a = static_cast<int32_t>(fp8::BitsOf(x[c]) & 0x7fffffffu);
    const int32_t v = a > static_cast<int32_t>(fp8::kInfBits) ? 0 : a;
    best = v > best ? v : best;
  }
  return best;
}

inline float BlockAmax(const float* x, int n) {
  const int32_t floor = static_cast<int32_t>(fp8::BitsOf(kFp8MinAmax));
  return fp8::FloatOf(static_cast<uint32_t>(n == kFp8Block ? AmaxBits<kFp8Block>(x, n, floor)
                                                           : AmaxBits<0>(x, n, floor)));
}

// q[c] = e4m3(x[c] / s); a full block's trip count is constant, so GCC's
// -O2 (very cheap cost model) vectorises it, into a local buffer (uint8_t
// stores could otherwise alias x).
inline void EncodeBlock(const float* x, float s, uint8_t* q, int n) {
  if (n == kFp8Block) {
    uint8_t codes[kFp8Block];
    for (int c = 0; c < kFp8Block; ++c) codes[c] = fp8::EncodeE4m3(x[c] / s);
    std::memcpy(q, codes, kFp8Block);
  } else {
    for (int c = 0; c < n; ++c) q[c] = fp8::EncodeE4m3(x[c] / s);
  }
}

// Every code's value: decoding through the table beats the branch-free
// conversion (0.42-0.56 vs 0.55-0.58 ns a value at 256 x 7168 here).
const float* DecodeTable() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t;
    for (int c = 0; c < 256; ++c) t[c] = fp8::DecodeE4m3(static_cast<uint8_t>(c));
    return t;
  }();
  return table.data();
}

}  // namespace

void QuantizeFp8Rows(const float* x, uint8_t* q, float* scale, int m, int k, int ldx) {
  if (ldx == 0) ldx = k;
  const int kb = Fp8Blocks(k);
  for (int i = 0; i < m; ++i) {
    const float* row = x + static_cast<size_t>(i) * ldx;
    for (int b = 0; b < kb; ++b) {
      const int c0 = b * kFp8Block, n = std::min(k, c0 + kFp8Block) - c0;
      const float s = BlockAmax(row + c0, n) / kFp8Max;
      scale[static_cast<size_t>(i) * kb + b] = s;
      EncodeBlock(row + c0, s, q + static_cast<size_t>(i) * k + c0, n);
    }
  }
}

void DequantizeFp8Rows(const uint8_t* q, const float* scale, float* x, int m, int k) {
  const float* lut = DecodeTable();
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
      float amax = kFp8MinAmax;
      for (int r = r0; r < r1; ++r) {
        for (int c = c0; c < c1; ++c)
          amax = std::max(amax, std::fabs(w[static_cast<size_t>(r) * k + c]));
      }
      const float s = amax / kFp8Max;
      scale[static_cast<size_t>(bj) * kb + b] = s;
      for (int r = r0; r < r1; ++r) {
        for (int c = c0; c < c1; ++c) {
          const size_t at = static_cast<size_t>(r) * k + c;
          q[at] = fp8::EncodeE4m3(w[at] / s);
        }
      }
    }
  }
}

void Fp8BlockLinear(const uint8_t* x, const float* x_scale, const uint8_t* w, const float* w_scale,
                    float* y, int m, int n, int k) {
  const int kb = Fp8Blocks(k);
  const float* lut = DecodeTable();
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

float Fp8KvScale(float amax) {
  const float a = std::isfinite(amax) ? std::max(amax, kFp8KvAmaxFloor) : kFp8Max;
  int exponent = 0;
  // a / 448 = m · 2^e with m in [0.5, 1): the next power of two is 2^e, or
  // 2^(e-1) when m is exactly 0.5.
  const float m = std::frexp(a / kFp8Max, &exponent);
  return std::ldexp(1.0f, m == 0.5f ? exponent - 1 : exponent);
}

namespace {

// Each latent value's code and its 128-value group's scale, through
// `code(c, e4m3, scale)`, in order (a group's first value first).
template <typename F>
void QuantizeKvLatent(const float* row, int latent, F&& code) {
  for (int start = 0; start < latent; start += kFp8Block) {
    const int n = std::min(kFp8Block, latent - start);
    float amax = 0.0f;
    for (int c = 0; c < n; ++c) {
      const float a = std::fabs(row[start + c]);
      if (a > amax) amax = a;  // NaN compares false: skipped
    }
    const float s = Fp8KvScale(amax);
    for (int c = 0; c < n; ++c) code(start + c, F32ToF8E4M3(row[start + c] / s), s);
  }
}

}  // namespace

void PackFp8KvRow(const float* row, const Fp8KvRowLayout& layout, uint8_t* out) {
  std::memset(out, 0, static_cast<size_t>(layout.bytes()));
  QuantizeKvLatent(row, layout.latent, [&](int c, uint8_t q, float s) {
    out[c] = q;
    if (c % kFp8Block == 0) std::memcpy(out + layout.scales_offset() + 4 * (c / kFp8Block), &s, 4);
  });
  for (int c = 0; c < layout.rope; ++c) {
    const uint16_t b = F32ToBf16(row[layout.latent + c]);
    std::memcpy(out + layout.rope_offset() + 2 * c, &b, sizeof(b));
  }
}

void UnpackFp8KvRow(const uint8_t* in, const Fp8KvRowLayout& layout, float* row) {
  for (int c = 0; c < layout.latent; ++c) {
    float s = 0.0f;
    std::memcpy(&s, in + layout.scales_offset() + 4 * (c / kFp8Block), sizeof(s));
    row[c] = F8E4M3ToF32(in[c]) * s;
  }
  for (int c = 0; c < layout.rope; ++c) {
    uint16_t b = 0;
    std::memcpy(&b, in + layout.rope_offset() + 2 * c, sizeof(b));
    row[layout.latent + c] = Bf16ToF32(b);
  }
}

void RoundTripFp8KvRow(float* row, int latent, int rope) {
  QuantizeKvLatent(row, latent, [&](int c, uint8_t q, float s) { row[c] = F8E4M3ToF32(q) * s; });
  for (int c = latent; c < latent + rope; ++c) row[c] = Bf16ToF32(F32ToBf16(row[c]));
}

}  // namespace moesh::cpu
