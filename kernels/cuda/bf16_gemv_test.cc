// RunBf16Gemv (bf16_gemv.h) element by element against a double-precision
// reference and cuBLASLt's batched GEMM on the same inputs, at MLA's absorbed
// layouts (per-head W_UK and W_UV with strided heads and outputs; what lies
// between a head's outputs untouched), more rows, accumulation, defaults, a
// shared x, an n that is no multiple of 16; the same bits run to run; what it
// refuses.
// Skips where no GPU is present.
#include "kernels/cuda/bf16_gemv.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "base/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::FreshSeed;
using testing::Randn;
using testing::ToBf16Rounding;
using testing::Upload;

std::vector<float> Read(const DeviceBuffer<uint8_t>& y, OutType out, size_t n) {
  std::vector<float> v(n);
  auto raw = y.ToHost();
  EXPECT_TRUE(raw.ok());
  if (!raw.ok()) return v;
  for (size_t i = 0; i < n; ++i) {
    if (out == OutType::kFloat32) {
      std::memcpy(&v[i], raw->data() + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, raw->data() + 2 * i, 2);
      v[i] = Bf16ToF32(b);
    }
  }
  return v;
}

TEST(Bf16GemvTest, MatchesADoubleReferenceAndCublas) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(auto gemm, CublasGemm::Create());
  struct Case {
    int batch, m, n, k, ldx, ldw, ldy;  // 0: the defaults (k, k, n)
    int64_t stride_x, stride_w, stride_y;
    OutType out;
    bool accumulate;
  };
  // MLA's layouts at V2-Lite's widths: W_UK (q rows of 16 heads x 192, the
  // nope part; W_UK^T [512, 128] a head; into q_mla's rows of 16 x 576, the
  // rope columns between heads left alone) and W_UV (latent rows [16 x
  // 512], W_UV [128, 512] a head); V3's 128 heads at 8 rows; then odd sizes,
  // defaults, a shared x (stride_x 0) and accumulation in both formats.
  const Case cases[] = {
      {16, 3, 512, 128, 16 * 192, 128, 16 * 576, 192, 512 * 128, 576, OutType::kBf16, false},
      {16, 3, 128, 512, 16 * 512, 512, 16 * 128, 512, 128 * 512, 128, OutType::kBf16, false},
      {128, 8, 512, 128, 128 * 192, 128, 128 * 576, 192, 512 * 128, 576, OutType::kBf16, false},
      {3, 5, 200, 96, 96, 104, 0, 5 * 96, 200 * 104, 5 * 200, OutType::kFloat32, true},
      {4, 2, 40, 64, 0, 0, 0, 0, 40 * 64, 2 * 40, OutType::kBf16, true},
      {1, 1, 7, 32, 32, 32, 0, 0, 0, 0, OutType::kFloat32, false},
  };
  for (const Case& c : cases) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << "batch=" << c.batch << " m=" << c.m << " n=" << c.n
                                      << " k=" << c.k << " seed=" << seed);
    std::mt19937 rng(seed);
    const int ldx = c.ldx ? c.ldx : c.k, ldw = c.ldw ? c.ldw : c.k, ldy = c.ldy ? c.ldy : c.n;
    const size_t x_size =
        static_cast<size_t>(c.batch - 1) * c.stride_x + static_cast<size_t>(c.m - 1) * ldx + c.k;
    const size_t w_size =
        static_cast<size_t>(c.batch - 1) * c.stride_w + static_cast<size_t>(c.n - 1) * ldw + c.k;
    const size_t y_size =
        static_cast<size_t>(c.batch - 1) * c.stride_y + static_cast<size_t>(c.m - 1) * ldy + c.n;
    std::vector<float> x = Randn(x_size, rng), w = Randn(w_size, rng, 0.05f);
    std::vector<float> y0 = Randn(y_size, rng);  // the outputs' old values and the gaps'
    const size_t es = c.out == OutType::kFloat32 ? 4 : 2;
    if (es == 2) ToBf16Rounding(y0);
    MOESH_ASSERT_OK_AND_ASSIGN(auto dx, Upload(ToBf16Rounding(x)));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dw, Upload(ToBf16Rounding(w)));
    // The reference, and a bound per output: fp32 sums of the products'
    // magnitudes, plus bf16's rounding of the result.
    std::vector<float> want = y0;
    std::vector<double> bound(y_size, 0.0), mags(y_size, 0.0);
    std::vector<bool> out(y_size, false);
    for (int b = 0; b < c.batch; ++b) {
      for (int t = 0; t < c.m; ++t) {
        for (int j = 0; j < c.n; ++j) {
          const size_t at = b * c.stride_y + static_cast<size_t>(t) * ldy + j;
          double acc = c.accumulate ? y0[at] : 0.0, mag = c.accumulate ? std::abs(y0[at]) : 0.0;
          for (int i = 0; i < c.k; ++i) {
            const double prod = static_cast<double>(x[b * c.stride_x + int64_t{t} * ldx + i]) *
                                w[b * c.stride_w + int64_t{j} * ldw + i];
            acc += prod;
            mag += std::abs(prod);
          }
          want[at] = static_cast<float>(acc);
          bound[at] = 1e-5 * mag + (es == 2 ? 8e-3 * std::abs(acc) : 0.0) + 1e-30;
          mags[at] = mag;
          out[at] = true;
        }
      }
    }
    std::vector<uint8_t> y_init(y_size * es);
    for (size_t i = 0; i < y_size; ++i) {
      if (es == 4) {
        std::memcpy(&y_init[4 * i], &y0[i], 4);
      } else {
        const uint16_t h = F32ToBf16(y0[i]);
        std::memcpy(&y_init[2 * i], &h, 2);
      }
    }
    BatchedGemmParams p;
    p.x = dx.get(), p.w = dw.get(), p.out_type = c.out;
    p.batch = c.batch, p.m = c.m, p.n = c.n, p.k = c.k, p.ldx = c.ldx, p.ldw = c.ldw, p.ldy = c.ldy;
    p.stride_x = c.stride_x, p.stride_w = c.stride_w, p.stride_y = c.stride_y;
    p.accumulate = c.accumulate;
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      MOESH_ASSERT_OK_AND_ASSIGN(auto dy, Upload(y_init));
      p.y = dy.get();
      ASSERT_TRUE(Bf16GemvFits(p));
      MOESH_ASSERT_OK(RunBf16Gemv(p));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = Read(dy, c.out, y_size);
      for (size_t i = 0; i < y_size; ++i) {
        if (!out[i]) {
          ASSERT_EQ(got[i], y0[i]) << "element " << i << " outside the outputs was written";
          continue;
        }
        ASSERT_LE(std::abs(got[i] - want[i]), bound[i])
            << "element " << i << ": " << got[i] << " against " << want[i];
      }
      if (run == 0) {
        first = got;
      } else {
        EXPECT_EQ(got, first) << "not deterministic";
      }
    }
    // cuBLASLt's batched GEMM on the same inputs: the same values up to the
    // sums' order and bf16 rounding — its own: for a bf16 output its heuristic
    // may split k and round the partial sums to bf16 (on the H100 one output of
    // MLA's W_UK case came back 2^-10 from ours, eight bf16 steps at its
    // value, ours within the double reference's bound), so a bf16 comparison
    // also allows bf16's relative step on the products' magnitudes.
    if (c.k % 8 == 0 && ldx % 8 == 0 && ldw % 8 == 0 &&
        (c.batch == 1 ||
         (c.stride_x % 8 == 0 && c.stride_w % 8 == 0 && c.stride_y * es % 16 == 0))) {
      MOESH_ASSERT_OK_AND_ASSIGN(auto dy, Upload(y_init));
      p.y = dy.get();
      MOESH_ASSERT_OK(gemm->RunBatched(p));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> theirs = Read(dy, c.out, y_size);
      for (size_t i = 0; i < y_size; ++i) {
        const double partials = es == 2 ? std::ldexp(mags[i], -8) : 0.0;
        ASSERT_LE(std::abs(theirs[i] - first[i]), 2 * bound[i] + partials)
            << "element " << i << " against cuBLASLt's";
      }
    }
  }
}

TEST(Bf16GemvTest, RefusesWhatItDoesNotTake) {
  BatchedGemmParams p;
  p.x = reinterpret_cast<const bf16*>(uintptr_t{256});
  p.w = reinterpret_cast<const bf16*>(uintptr_t{512});
  p.y = reinterpret_cast<void*>(uintptr_t{1024});
  p.batch = 2, p.m = 1, p.n = 64, p.k = 128;
  EXPECT_TRUE(Bf16GemvFits(p));
  BatchedGemmParams q = p;
  q.m = kBf16GemvMaxRows + 1;
  EXPECT_FALSE(Bf16GemvFits(q));
  q = p, q.k = 48;  // not a multiple of 32
  EXPECT_FALSE(Bf16GemvFits(q));
  q = p, q.w_kn = true;
  EXPECT_FALSE(Bf16GemvFits(q));
  q = p, q.ldx = 132;  // rows not 16-byte aligned
  EXPECT_FALSE(Bf16GemvFits(q));
  q = p, q.x = reinterpret_cast<const bf16*>(uintptr_t{258});
  EXPECT_FALSE(Bf16GemvFits(q));
  q = p, q.ldy = 32;  // below n
  EXPECT_FALSE(Bf16GemvFits(q));
  EXPECT_EQ(RunBf16Gemv(q).code(), absl::StatusCode::kInvalidArgument);
  q = p, q.y = nullptr;
  EXPECT_FALSE(Bf16GemvFits(q));
  EXPECT_EQ(RunBf16Gemv(q).code(), absl::StatusCode::kInvalidArgument);
  q = p, q.x = nullptr;
  EXPECT_FALSE(Bf16GemvFits(q));
}

}  // namespace
}  // namespace moesh::cuda
