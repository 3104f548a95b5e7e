// The block-scaled FP8 reference: quantization keeps every value within
// e4m3's rounding of it, maps each block's largest magnitude to ±448, and the
// block-scaled linear equals the float32 linear of the dequantized operands.
#include "kernels/cpu/fp8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/ops.h"

namespace moesh::cpu {
namespace {

std::vector<float> Randn(size_t n, std::mt19937& rng, float sd) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(Fp8Test, RowQuantizationKeepsValuesWithinRounding) {
  std::mt19937 rng(7);
  const int m = 5, k = 300;  // the last block is 44 wide
  std::vector<float> x = Randn(static_cast<size_t>(m) * k, rng, 3.0f);
  for (int c = 128; c < 256; ++c) x[2 * k + c] = 0.0f;  // an all-zero block
  std::vector<uint8_t> q(x.size());
  std::vector<float> scale(static_cast<size_t>(m) * Fp8Blocks(k));
  QuantizeFp8Rows(x.data(), q.data(), scale.data(), m, k);
  for (int i = 0; i < m; ++i) {
    for (int b = 0; b < Fp8Blocks(k); ++b) {
      const float s = scale[i * Fp8Blocks(k) + b];
      float amax = 0, qmax = 0;
      for (int c = b * kFp8Block; c < std::min(k, (b + 1) * kFp8Block); ++c) {
        const float v = x[i * k + c], back = F8E4M3ToF32(q[i * k + c]) * s;
        // e4m3 keeps 3 mantissa bits: within 2^-4 relative, or the subnormal step.
        EXPECT_NEAR(back, v, std::max(std::fabs(v) / 16, s * std::ldexp(1.0f, -10)))
            << i << "," << c;
        amax = std::max(amax, std::fabs(v));
        qmax = std::max(qmax, std::fabs(F8E4M3ToF32(q[i * k + c])));
      }
      if (amax > 0) {
        EXPECT_FLOAT_EQ(s, amax / 448.0f);
        EXPECT_EQ(qmax, 448.0f);
      } else {
        EXPECT_GT(s, 0.0f);  // a zero block: codes 0, a tiny scale
        EXPECT_EQ(qmax, 0.0f);
      }
    }
  }
}

TEST(Fp8Test, DequantizeRowsInvertsQuantizeRows) {
  std::mt19937 rng(5);
  const int m = 3, k = 200;  // the last block is 72 wide
  const std::vector<float> x = Randn(static_cast<size_t>(m) * k, rng, 2.0f);
  std::vector<uint8_t> q(x.size());
  std::vector<float> scale(static_cast<size_t>(m) * Fp8Blocks(k)), back(x.size(), -1.0f);
  QuantizeFp8Rows(x.data(), q.data(), scale.data(), m, k);
  DequantizeFp8Rows(q.data(), scale.data(), back.data(), m, k);
  for (int i = 0; i < m; ++i) {
    for (int c = 0; c < k; ++c) {
      // Each element with its own row's and block's scale (bit-exact).
      EXPECT_EQ(back[i * k + c], F8E4M3ToF32(q[i * k + c]) * scale[i * Fp8Blocks(k) + c / 128])
          << i << "," << c;
    }
  }
}

// The scalar loops QuantizeFp8Rows / DequantizeFp8Rows replaced (std::max
// of fabs, one conversion a value; ~15 ns a value): the vectorised ones must
// give their bits for every input.
void ReferenceQuantizeRows(const float* x, uint8_t* q, float* scale, int m, int k) {
  const int kb = Fp8Blocks(k);
  for (int i = 0; i < m; ++i) {
    const float* row = x + static_cast<size_t>(i) * k;
    for (int b = 0; b < kb; ++b) {
      const int c0 = b * kFp8Block, c1 = std::min(k, c0 + kFp8Block);
      float amax = 1e-10f;
      for (int c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(row[c]));
      const float s = amax / kFp8Max;
      scale[static_cast<size_t>(i) * kb + b] = s;
      for (int c = c0; c < c1; ++c) q[static_cast<size_t>(i) * k + c] = F32ToF8E4M3(row[c] / s);
    }
  }
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

TEST(Fp8Test, RowCodecIsTheScalarLoopsBitForBit) {
  std::mt19937 rng(23);
  const int m = 9, k = 7168 + 40;  // 57 blocks, the last 40 wide
  std::vector<float> x = Randn(static_cast<size_t>(m) * k, rng, 2.0f);
  // Rows of other kinds: every bit pattern (NaNs, infinities, subnormals),
  // one with a NaN and an infinity among normal values, zeros and -0,
  // values far beyond 448 and tiny ones, and a block at exact code values.
  for (int c = 0; c < k; ++c)
    x[1 * k + c] = [&] {
      const uint32_t u = static_cast<uint32_t>(rng());
      float f;
      std::memcpy(&f, &u, sizeof(f));
      return f;
    }();
  x[2 * k + 5] = NAN, x[2 * k + 300] = -INFINITY, x[2 * k + 700] = -NAN;
  for (int c = 0; c < k; ++c) x[3 * k + c] = c % 3 == 0 ? -0.0f : 0.0f;
  for (int c = 0; c < k; ++c) x[4 * k + c] = x[4 * k + c] * 1e30f;
  for (int c = 0; c < k; ++c) x[5 * k + c] = x[5 * k + c] * 1e-40f;  // float subnormals
  for (int c = 0; c < kFp8Block; ++c) x[6 * k + c] = F8E4M3ToF32(static_cast<uint8_t>(c));
  for (int c = 0; c < k; ++c) x[7 * k + c] = c % 128 == 0 ? 448.0f * 1.001f : x[7 * k + c];
  const size_t nscale = static_cast<size_t>(m) * Fp8Blocks(k);
  std::vector<uint8_t> q(x.size()), want_q(x.size());
  std::vector<float> scale(nscale), want_scale(nscale);
  QuantizeFp8Rows(x.data(), q.data(), scale.data(), m, k);
  ReferenceQuantizeRows(x.data(), want_q.data(), want_scale.data(), m, k);
  for (size_t b = 0; b < nscale; ++b) ASSERT_EQ(Bits(scale[b]), Bits(want_scale[b])) << b;
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(q[i], want_q[i]) << "value " << i;
  // Decode: every code (a row of random bytes too) times the row's scales.
  for (int c = 0; c < k; ++c) q[8 * k + c] = static_cast<uint8_t>(c < 256 ? c : rng());
  std::vector<float> back(x.size());
  DequantizeFp8Rows(q.data(), scale.data(), back.data(), m, k);
  for (int i = 0; i < m; ++i) {
    for (int c = 0; c < k; ++c) {
      const float want = F8E4M3ToF32(q[i * k + c]) * scale[i * Fp8Blocks(k) + c / kFp8Block];
      ASSERT_EQ(Bits(back[i * k + c]), Bits(want)) << i << "," << c;
    }
  }
}

TEST(Fp8Test, BlockLinearIsTheLinearOfTheDequantizedOperands) {
  std::mt19937 rng(11);
  const int m = 3, n = 200, k = 384;
  const std::vector<float> x = Randn(static_cast<size_t>(m) * k, rng, 1.0f),
                           w = Randn(static_cast<size_t>(n) * k, rng, 0.05f);
  std::vector<uint8_t> xq(x.size()), wq(w.size());
  std::vector<float> xs(static_cast<size_t>(m) * Fp8Blocks(k)),
      ws(static_cast<size_t>(Fp8Blocks(n)) * Fp8Blocks(k));
  QuantizeFp8Rows(x.data(), xq.data(), xs.data(), m, k);
  QuantizeFp8Blocks(w.data(), wq.data(), ws.data(), n, k);
  std::vector<float> xd(x.size()), wd(w.size());
  for (int i = 0; i < m; ++i)
    for (int c = 0; c < k; ++c)
      xd[i * k + c] = F8E4M3ToF32(xq[i * k + c]) * xs[i * Fp8Blocks(k) + c / kFp8Block];
  for (int j = 0; j < n; ++j)
    for (int c = 0; c < k; ++c)
      wd[j * k + c] =
          F8E4M3ToF32(wq[j * k + c]) * ws[(j / kFp8Block) * Fp8Blocks(k) + c / kFp8Block];
  std::vector<float> y(static_cast<size_t>(m) * n), ref(y.size()), exact(y.size());
  Fp8BlockLinear(xq.data(), xs.data(), wq.data(), ws.data(), y.data(), m, n, k);
  Linear(xd.data(), wd.data(), ref.data(), m, n, k);
  Linear(x.data(), w.data(), exact.data(), m, n, k);
  double err = 0, norm = 0, qerr = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_NEAR(y[i], ref[i], 1e-4f * (1 + std::fabs(ref[i]))) << i;
    err += (y[i] - exact[i]) * (y[i] - exact[i]);
    norm += exact[i] * exact[i];
    qerr += (ref[i] - exact[i]) * (ref[i] - exact[i]);
  }
  // FP8 costs accuracy, but not much: a few percent of the output's norm.
  EXPECT_LT(std::sqrt(err / norm), 0.05);
  EXPECT_GT(std::sqrt(qerr / norm), 1e-4);  // and the quantization did happen
}

// The FP8 KV cache row (FlashMLA's layout): power-of-two scales that put each
// tile's largest magnitude at or under 448, values within e4m3's rounding,
// the rope part in bf16, and a round trip that changes nothing the second
// time (rows handed over as floats store back the same).
TEST(Fp8Test, KvRowRoundTrip) {
  std::mt19937 rng(11);
  const int latent = 512, rope = 64;
  std::vector<float> row = Randn(latent + rope, rng, 2.0f);
  for (int c = 128; c < 256; ++c) row[c] *= 1e-3f;  // a tile of small values
  for (int c = 256; c < 384; ++c) row[c] = 0.0f;    // an all-zero tile
  const std::vector<float> x = row;
  RoundTripFp8KvRow(row.data(), latent, rope);
  for (int t = 0; t < latent / kFp8Block; ++t) {
    float amax = 0;
    for (int c = t * kFp8Block; c < (t + 1) * kFp8Block; ++c)
      amax = std::max(amax, std::fabs(x[c]));
    const float s = Fp8KvScale(amax);
    int e = 0;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << "tile " << t << ": scale " << s << " is a power of two";
    EXPECT_LE(std::max(amax, kFp8KvAmaxFloor) / s, kFp8Max) << t;
    EXPECT_GT(std::max(amax, kFp8KvAmaxFloor) / s, kFp8Max / 2) << t;  // the smallest such power
    for (int c = t * kFp8Block; c < (t + 1) * kFp8Block; ++c) {
      // 3 mantissa bits: within 2^-4 relative, or the subnormal step 2^-9 · s.
      EXPECT_LE(std::fabs(row[c] - x[c]), std::max(std::fabs(x[c]) / 16, s / 512)) << c;
    }
  }
  for (int c = 256; c < 384; ++c) EXPECT_EQ(row[c], 0.0f);
  for (int c = latent; c < latent + rope; ++c) EXPECT_EQ(row[c], Bf16ToF32(F32ToBf16(x[c])));
  std::vector<float> again = row;
  RoundTripFp8KvRow(again.data(), latent, rope);
  EXPECT_EQ(std::memcmp(again.data(), row.data(), row.size() * sizeof(float)), 0);
  // A NaN does not poison its tile's scale.
  std::vector<float> bad(latent + rope, 1.0f);
  bad[5] = NAN;
  RoundTripFp8KvRow(bad.data(), latent, rope);
  EXPECT_EQ(bad[6], 1.0f);
}

// The device cache's bytes: Unpack(Pack(row)) is the round trip, the scales
// sit after the codes and the rope after them, the padding is zero; a tiny
// model's latent of 32 (one narrow group) as well as V3's 512 + 64.
TEST(Fp8Test, KvRowPacksIntoFlashMlasLayout) {
  std::mt19937 rng(12);
  for (const Fp8KvRowLayout layout : {Fp8KvRowLayout{512, 64}, Fp8KvRowLayout{32, 8}}) {
    SCOPED_TRACE(layout.latent);
    EXPECT_EQ(layout.bytes() % 16, 0);
    std::vector<float> row = Randn(layout.latent + layout.rope, rng, 3.0f);
    std::vector<uint8_t> bytes(static_cast<size_t>(layout.bytes()), 0xAB);
    PackFp8KvRow(row.data(), layout, bytes.data());
    std::vector<float> back(row.size());
    UnpackFp8KvRow(bytes.data(), layout, back.data());
    std::vector<float> want = row;
    RoundTripFp8KvRow(want.data(), layout.latent, layout.rope);
    EXPECT_EQ(std::memcmp(back.data(), want.data(), want.size() * sizeof(float)), 0);
    for (int g = 0; g < Fp8Blocks(layout.latent); ++g) {
      float s = 0, amax = 0;
      std::memcpy(&s, bytes.data() + layout.scales_offset() + 4 * g, 4);
      for (int c = g * kFp8Block; c < std::min(layout.latent, (g + 1) * kFp8Block); ++c)
        amax = std::max(amax, std::fabs(row[c]));
      EXPECT_EQ(s, Fp8KvScale(amax)) << "group " << g;
    }
    for (int c = 0; c < layout.rope; ++c) {
      uint16_t b = 0;
      std::memcpy(&b, bytes.data() + layout.rope_offset() + 2 * c, 2);
      EXPECT_EQ(b, F32ToBf16(row[layout.latent + c])) << c;
    }
    for (int i = layout.rope_offset() + 2 * layout.rope; i < layout.bytes(); ++i)
      EXPECT_EQ(bytes[i], 0) << "padding byte " << i;
  }
}

}  // namespace
}  // namespace moesh::cpu
