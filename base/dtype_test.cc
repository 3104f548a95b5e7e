#include "base/dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace moesh {
namespace {

// The scalar definitions of the e4m3 conversions (frexp, ldexp, nearbyint;
// ~15 ns a value), which base/fp8_e4m3.h's branch-free ones must equal bit
// for bit.
float ReferenceF8E4M3ToF32(uint8_t v) {
  const uint32_t sign = v >> 7;
  const uint32_t exp = (v >> 3) & 0xfu;
  const uint32_t mant = v & 0x7u;
  float mag;
  if (exp == 0xf && mant == 0x7) {
    mag = NAN;  // e4m3fn has no infinities
  } else if (exp == 0) {
    mag = std::ldexp(static_cast<float>(mant), -9);
  } else {
    mag = std::ldexp(static_cast<float>(mant | 0x8u), static_cast<int>(exp) - 10);
  }
  return sign ? -mag : mag;
}

uint8_t ReferenceF32ToF8E4M3(float f) {
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  if (std::isnan(f)) return sign | 0x7f;
  const float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // the largest finite value
  if (a == 0.0f) return sign;
  int e = 0;
  std::frexp(a, &e);
  int exp = e - 1;  // a in [2^exp, 2^(exp+1))
  if (exp < -6) {
    // Subnormal: mant * 2^-9. Rounding up to 8 gives 2^-6, the smallest
    // normal, whose code is 8 too.
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int mant = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - exp)));  // [8, 16]
  if (mant == 16) mant = 8, ++exp;
  return sign | static_cast<uint8_t>(((exp + 7) << 3) | (mant - 8));
}

TEST(DTypeTest, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kI64, DType::kI32,
                  DType::kF8E8M0, DType::kI8, DType::kU8}) {
    absl::StatusOr<DType> parsed = ParseDType(DTypeName(t));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(ParseDType("F64").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseDType("F4").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToF32(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even (1).
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // Slightly above halfway rounds up.
  EXPECT_EQ(Bf16ToF32(F32ToBf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20))),
            1.0f + std::ldexp(1.0f, -7));
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(NAN))));
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 3.0f);
  for (int i = 0; i < 1000; ++i) {
    const float x = d(rng);
    EXPECT_LE(std::fabs(Bf16ToF32(F32ToBf16(x)) - x), std::fabs(x) * std::ldexp(1.0f, -8));
  }
}

TEST(DTypeTest, F16Conversions) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(F16ToF32(0x7c00)));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> d(-1000.0f, 1000.0f);
  for (int i = 0; i < 1000; ++i) {
    const float x = d(rng);
    EXPECT_LE(std::fabs(F16ToF32(F32ToF16(x)) - x), std::fabs(x) * std::ldexp(1.0f, -11));
  }
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite positive half survives a round trip
    ASSERT_EQ(F32ToF16(F16ToF32(static_cast<uint16_t>(h))), h) << h;
  }
}

TEST(DTypeTest, Fp8E4M3) {
  EXPECT_EQ(F8E4M3ToF32(0x38), 1.0f);    // exp 7, mantissa 0
  EXPECT_EQ(F8E4M3ToF32(0x7e), 448.0f);  // largest finite
  EXPECT_EQ(F8E4M3ToF32(0xb8), -1.0f);
  EXPECT_EQ(F8E4M3ToF32(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(F8E4M3ToF32(0x7f)));
}

TEST(DTypeTest, Fp8E4M3Encode) {
  for (int c = 0; c < 256; ++c) {  // every finite code survives a round trip
    if ((c & 0x7f) == 0x7f) continue;
    ASSERT_EQ(F32ToF8E4M3(F8E4M3ToF32(static_cast<uint8_t>(c))), c) << c;
  }
  // Round to nearest, ties to even, between neighbouring codes.
  EXPECT_EQ(F32ToF8E4M3(1.0625f), 0x38);  // halfway 1 and 1.125: to even (1)
  EXPECT_EQ(F32ToF8E4M3(1.1875f), 0x3a);  // halfway 1.125 and 1.25: to even (1.25)
  EXPECT_EQ(F32ToF8E4M3(1.07f), 0x39);    // above halfway: up
  EXPECT_EQ(F32ToF8E4M3(15.5f), 0x58);    // 15 and 16 tie: to even, 16 (exponent carries)
  EXPECT_EQ(F32ToF8E4M3(std::ldexp(1.5f, -10)), 0x01);  // 0.75 of the smallest subnormal: up
  EXPECT_EQ(F32ToF8E4M3(std::ldexp(1.0f, -10)), 0x00);  // half the smallest: to even (0)
  EXPECT_EQ(F32ToF8E4M3(std::ldexp(7.5f, -9)), 0x08);   // rounds up into the first normal
  EXPECT_EQ(F32ToF8E4M3(1000.0f), 0x7e);                // saturates
  EXPECT_EQ(F32ToF8E4M3(-1e30f), 0xfe);
  EXPECT_EQ(F32ToF8E4M3(-0.0f), 0x80);
  EXPECT_EQ(F32ToF8E4M3(NAN) & 0x7f, 0x7f);
}

float FloatBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

uint32_t BitsOfFloat(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

TEST(DTypeTest, Fp8E4M3DecodeIsTheScalarDefinition) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t v = static_cast<uint8_t>(c);
    ASSERT_EQ(BitsOfFloat(F8E4M3ToF32(v)), BitsOfFloat(ReferenceF8E4M3ToF32(v))) << c;
  }
}

// Every float whose e4m3 code could change between it and a neighbour: each
// code's value, each midpoint between neighbouring codes (the rounding
// boundaries, ties to even), ±448 and the saturation, 2^-6 (the first normal),
// the subnormals' steps, and ±1 and ±2 ulp around each; then the specials and
// random bit patterns of every exponent.
TEST(DTypeTest, Fp8E4M3EncodeIsTheScalarDefinition) {
  std::vector<float> points;
  for (int c = 0; c < 0x7f; ++c) {
    const float v = ReferenceF8E4M3ToF32(static_cast<uint8_t>(c));
    const float next = c + 1 < 0x7f ? ReferenceF8E4M3ToF32(static_cast<uint8_t>(c + 1)) : 480.0f;
    points.push_back(v);
    points.push_back((v + next) / 2);  // exact: neighbours differ in few bits
  }
  for (float v : {464.0f, 480.0f, 512.0f, 1e10f, std::ldexp(1.0f, -6), std::ldexp(1.0f, -10),
                  std::ldexp(1.0f, -11), std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min()}) {
    points.push_back(v);
  }
  std::vector<uint32_t> bits;
  for (float p : points) {
    const uint32_t u = BitsOfFloat(p);
    for (int d = -2; d <= 2; ++d) {
      bits.push_back(u + d);
      bits.push_back((u + d) | 0x80000000u);  // the negative side
    }
  }
  for (uint32_t u : {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
                     0x7f800001u, 0xff800001u, 0x7fffffffu, 0xffffffffu, 0x00000001u, 0x007fffffu,
                     0x80000001u, 0x807fffffu}) {
    bits.push_back(u);
  }
  std::mt19937 rng(17);
  for (int i = 0; i < (1 << 22); ++i) bits.push_back(static_cast<uint32_t>(rng()));
  // Every exponent from the subnormals to 2^9 with random mantissas.
  for (uint32_t e = 0; e <= 136; ++e) {
    for (int i = 0; i < 4096; ++i) bits.push_back((e << 23) | (rng() & 0x807fffffu));
  }
  int compared = 0;
  for (uint32_t u : bits) {
    const float f = FloatBits(u);
    ASSERT_EQ(F32ToF8E4M3(f), ReferenceF32ToF8E4M3(f)) << std::hex << "bits 0x" << u;
    ++compared;
  }
  EXPECT_GT(compared, 1 << 22);
}

TEST(DTypeTest, ConvertToF32) {
  const uint16_t bf[3] = {0x3f80, 0xc000, 0x0000};
  float out[3];
  ConvertToF32(DType::kBF16, bf, 3, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.0f);
}

}  // namespace
}  // namespace moesh
