#include "base/dtype.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace moesh {
namespace {

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
