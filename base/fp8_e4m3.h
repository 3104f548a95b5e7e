// e4m3fn (FP8: 1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no
// infinities, 0x7f/0xff NaN) to and from float32, branch-free on the bits so
// that loops over arrays auto-vectorise (kernels/cpu/fp8.cc: the dispatch
// wire's codec encodes with EncodeE4m3 and decodes through a table of
// DecodeE4m3). base/dtype.h's F8E4M3ToF32 / F32ToF8E4M3 are these.
//
// Defined for every float: the result is the scalar definition's
// (dtype_test holds it as the reference and compares every code, every
// boundary ±1 ulp and random bit patterns): round to nearest even,
// saturating at ±448 (±inf too), NaN -> sign | 0x7f, subnormals of 2^-9,
// signed zeros kept. Assumes the default rounding mode (round to nearest).
//
// Thread-safe: pure functions.
#ifndef MOESH_COMMON_BASE_FP8_E4M3_H_
#define MOESH_COMMON_BASE_FP8_E4M3_H_

#include <cstdint>
#include <cstring>

namespace moesh::fp8 {

inline uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float FloatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

constexpr uint32_t kMinNormalBits = 0x3c800000u;  // 2^-6, e4m3's smallest normal
constexpr uint32_t kMaxFiniteBits = 0x43e00000u;  // 448
constexpr uint32_t kInfBits = 0x7f800000u;
constexpr uint32_t kMagic23Bits = 0x4b000000u;  // 2^23: adding it rounds [0, 2^23) to an integer

inline uint8_t EncodeE4m3(float f) {
  const uint32_t u = BitsOf(f);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  // Normal: the 23-bit mantissa rounded to 3 (to even at bit 20; a carry
  // moves into the exponent), the exponent rebiased from 127 to 7.
  const uint32_t normal = ((a + 0x7ffffu + ((a >> 20) & 1u)) >> 20) - ((127u - 7u) << 3);
  // Subnormal (|f| < 2^-6): round(|f| * 2^9), which is exact before the
  // rounding addition; 8 is the smallest normal's code as well.
  const uint32_t sub = BitsOf(FloatOf(a) * 512.0f + 8388608.0f) - kMagic23Bits;
  // Selects as masks: both sides are computed, nothing moves into a branch
  // (a branch would keep the loop from vectorising).
  const uint32_t is_sub = 0u - static_cast<uint32_t>(a < kMinNormalBits);
  const uint32_t is_sat = 0u - static_cast<uint32_t>(a >= kMaxFiniteBits);  // infinities too
  const uint32_t is_nan = 0u - static_cast<uint32_t>(a > kInfBits);
  uint32_t code = (sub & is_sub) | (normal & ~is_sub);
  code = (0x7eu & is_sat) | (code & ~is_sat);
  code = (0x7fu & is_nan) | (code & ~is_nan);  // NaN
  return static_cast<uint8_t>(sign | code);
}

inline float DecodeE4m3(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t c = v & 0x7fu;
  const uint32_t normal = (c << 20) + ((127u - 7u) << 23);
  const uint32_t sub = BitsOf(static_cast<float>(static_cast<int32_t>(c)) * (1.0f / 512.0f));
  const uint32_t is_sub = 0u - static_cast<uint32_t>(c < 8u);
  const uint32_t is_nan = 0u - static_cast<uint32_t>(c == 0x7fu);
  uint32_t bits = (sub & is_sub) | (normal & ~is_sub);
  bits = (0x7fc00000u & is_nan) | (bits & ~is_nan);  // the quiet NaN
  return FloatOf(bits | sign);
}

}  // namespace moesh::fp8

#endif  // MOESH_COMMON_BASE_FP8_E4M3_H_
