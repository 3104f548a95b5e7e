// The MXFP4 codec: e2m1's grid and rounding, the nibble order DeepSeek-V4's
// checkpoints use, ue8m0 scales at their edges, and NaN/Inf as MX defines.
#include "kernels/cpu/mxfp4.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "gtest/gtest.h"

namespace moesh::cpu {
namespace {

TEST(Mxfp4Test, E2M1GridAndSign) {
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (uint8_t c = 0; c < 8; ++c) {
    EXPECT_EQ(E2M1ToF32(c), grid[c]);
    EXPECT_EQ(E2M1ToF32(c | 8), -grid[c]);
    EXPECT_EQ(F32ToE2M1(grid[c]), c);  // every representable value round-trips
    if (c > 0) EXPECT_EQ(F32ToE2M1(-grid[c]), c | 8);
  }
  EXPECT_TRUE(std::signbit(E2M1ToF32(8)));  // -0
  EXPECT_EQ(E2M1ToF32(0xF7), 6.0f);         // only the low nibble counts
}

TEST(Mxfp4Test, E2M1RoundsToNearestTiesToEvenAndSaturates) {
  EXPECT_EQ(E2M1ToF32(F32ToE2M1(0.24f)), 0.0f);
  EXPECT_EQ(E2M1ToF32(F32ToE2M1(0.26f)), 0.5f);
  EXPECT_EQ(E2M1ToF32(F32ToE2M1(0.25f)), 0.0f);  // tie: code 0 (even) over 1
  EXPECT_EQ(E2M1ToF32(F32ToE2M1(0.75f)), 1.0f);  // tie: code 2 over 1
  EXPECT_EQ(E2M1ToF32(F32ToE2M1(2.5f)), 2.0f);   // tie: code 4 over 5
  EXPECT_EQ(E2M1ToF32(F32ToE2M1(5.0f)), 4.0f);   // tie: code 6 over 7
  EXPECT_EQ(E2M1ToF32(F32ToE2M1(5.1f)), 6.0f);
  EXPECT_EQ(E2M1ToF32(F32ToE2M1(100.0f)), 6.0f);
  EXPECT_EQ(E2M1ToF32(F32ToE2M1(-INFINITY)), -6.0f);
  EXPECT_EQ(F32ToE2M1(NAN), 0);
}

TEST(Mxfp4Test, E8M0ScaleEdges) {
  EXPECT_EQ(E8M0ToF32(127), 1.0f);
  EXPECT_EQ(E8M0ToF32(128), 2.0f);
  EXPECT_EQ(E8M0ToF32(0), std::ldexp(1.0f, -127));  // the smallest: a float subnormal
  EXPECT_EQ(E8M0ToF32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(E8M0ToF32(kE8M0Nan)));
  EXPECT_EQ(Mxfp4ScaleFor(6.0f), 127);   // 6 fits scale 1 exactly
  EXPECT_EQ(Mxfp4ScaleFor(6.01f), 128);  // just over: the next power
  EXPECT_EQ(Mxfp4ScaleFor(3.0f), 126);
  EXPECT_EQ(Mxfp4ScaleFor(0.0f), 127);
  EXPECT_EQ(Mxfp4ScaleFor(1e-45f), 0);                               // clamped low
  EXPECT_EQ(Mxfp4ScaleFor(std::numeric_limits<float>::max()), 253);  // 6 * 2^126 holds it
  EXPECT_EQ(Mxfp4ScaleFor(INFINITY), kE8M0Nan);
  EXPECT_EQ(Mxfp4ScaleFor(NAN), kE8M0Nan);
}

TEST(Mxfp4Test, LowNibbleHoldsTheEvenElement) {
  std::vector<float> w(32, 0.0f);
  w[0] = 1.0f;   // code 2
  w[1] = -6.0f;  // code 0xF
  w[31] = 0.5f;  // code 1, high nibble of byte 15
  std::vector<uint8_t> packed(16), scale(1);
  QuantizeMxfp4(w.data(), packed.data(), scale.data(), 1, 32);
  EXPECT_EQ(scale[0], 127);
  EXPECT_EQ(packed[0], 0xF2);
  EXPECT_EQ(packed[15], 0x10);
  // And decoding a hand-packed byte: 0x71 = {0.5, 6}.
  packed.assign(16, 0);
  packed[0] = 0x71;
  scale[0] = 129;  // x4
  std::vector<float> out(32);
  DequantizeMxfp4(packed.data(), scale.data(), out.data(), 1, 32);
  EXPECT_EQ(out[0], 2.0f);
  EXPECT_EQ(out[1], 24.0f);
  EXPECT_EQ(out[2], 0.0f);
}

TEST(Mxfp4Test, RepresentableMatricesRoundTripExactly) {
  // Each 32-block: grid values times the block's power of two, with the
  // block's max magnitude 6 or 4 so the chosen scale is that power.
  const int n = 3, k = 64;
  std::mt19937 rng(7);
  std::vector<float> w(n * k);
  for (int r = 0; r < n; ++r) {
    for (int b = 0; b < k / 32; ++b) {
      const float p = std::ldexp(1.0f, (r * 5 + b * 3) % 40 - 20);
      for (int i = 0; i < 32; ++i) {
        const uint8_t c = static_cast<uint8_t>(rng() % 16);
        w[r * k + b * 32 + i] = E2M1ToF32(c) * p;
      }
      w[r * k + b * 32 + (r + b) % 32] = 6.0f * p;
    }
  }
  std::vector<uint8_t> packed(n * k / 2), scale(n * k / 32);
  QuantizeMxfp4(w.data(), packed.data(), scale.data(), n, k);
  std::vector<float> back(n * k);
  DequantizeMxfp4(packed.data(), scale.data(), back.data(), n, k);
  for (int i = 0; i < n * k; ++i) EXPECT_EQ(back[i], w[i]) << i;
}

TEST(Mxfp4Test, ANonFiniteValueMakesItsBlockNan) {
  std::vector<float> w(64, 1.0f);
  w[40] = INFINITY;
  std::vector<uint8_t> packed(32), scale(2);
  QuantizeMxfp4(w.data(), packed.data(), scale.data(), 1, 64);
  EXPECT_EQ(scale[0], 125);  // 1 / 2^-2 = 4 <= 6: the smallest scale that holds 1
  EXPECT_EQ(scale[1], kE8M0Nan);
  std::vector<float> back(64);
  DequantizeMxfp4(packed.data(), scale.data(), back.data(), 1, 64);
  EXPECT_EQ(back[0], 1.0f);
  for (int i = 32; i < 64; ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
}

}  // namespace
}  // namespace moesh::cpu
