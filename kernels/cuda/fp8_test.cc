// The block-scaled FP8 path against kernels/cpu/fp8: the activations'
// quantization bit for bit, and cuBLASLt's block-scaled GEMM against the CPU
// block linear on the same codes and scales.
#include "kernels/cuda/fp8.h"

#include <cmath>
#include <cstring>
#include <iostream>

#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using cpu::Fp8Blocks;
namespace t = testing;

// Row i's block b: [m][blocks] (the CPU's) from [blocks][Fp8Rows(m)] (cuBLASLt's).
std::vector<float> RowMajorScales(const std::vector<float>& by_block, int m, int k) {
  std::vector<float> out(static_cast<size_t>(m) * Fp8Blocks(k));
  for (int i = 0; i < m; ++i)
    for (int b = 0; b < Fp8Blocks(k); ++b) out[i * Fp8Blocks(k) + b] = by_block[b * Fp8Rows(m) + i];
  return out;
}

TEST(Fp8Test, QuantizeMatchesTheCpuBitForBit) {
  MOESH_REQUIRE_GPU();
  struct Case {
    int m, k, ldx;
  };
  for (const Case& c : {Case{1, 128, 0}, Case{7, 7168, 0}, Case{64, 1552, 1560}, Case{3, 16, 0}}) {
    const uint32_t seed = t::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "m=" << c.m << " k=" << c.k << " seed=" << seed);
    std::mt19937 rng(seed);
    const int ldx = c.ldx ? c.ldx : c.k;
    std::vector<float> x = t::Randn(static_cast<size_t>(c.m) * ldx, rng, 2.0f);
    for (int j = 0; j < std::min(c.k, 128); ++j) x[j] = 0.0f;  // an all-zero block
    MOESH_ASSERT_OK_AND_ASSIGN(auto dx, t::Upload(t::ToBf16Rounding(x)));
    const size_t rows = Fp8Rows(c.m);
    MOESH_ASSERT_OK_AND_ASSIGN(auto dq, DeviceBuffer<uint8_t>::Create(rows * c.k));
    MOESH_ASSERT_OK_AND_ASSIGN(auto ds, DeviceBuffer<float>::Create(rows * Fp8Blocks(c.k)));
    MOESH_ASSERT_OK(t::Poison(dq));
    MOESH_ASSERT_OK(t::Poison(ds));
    QuantizeFp8Params p;
    p.x = dx.get(), p.q = dq.get(), p.scale = ds.get();
    p.m = c.m, p.k = c.k, p.ldx = c.ldx;
    MOESH_ASSERT_OK(RunQuantizeFp8(p));
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> q, dq.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> s, ds.ToHost());
    std::vector<uint8_t> ref_q(q.size(), 0);  // the padding rows: zeros
    std::vector<float> ref_s(static_cast<size_t>(c.m) * Fp8Blocks(c.k));
    cpu::QuantizeFp8Rows(x.data(), ref_q.data(), ref_s.data(), c.m, c.k, ldx);
    EXPECT_EQ(q, ref_q);
    EXPECT_EQ(RowMajorScales(s, c.m, c.k), ref_s);
  }
  QuantizeFp8Params bad;
  bad.m = 1, bad.k = 100;  // not a multiple of 16
  EXPECT_EQ(RunQuantizeFp8(bad).code(), absl::StatusCode::kInvalidArgument);
}

TEST(Fp8Test, WeightBlockQuantizeMatchesTheCpuBitForBit) {
  MOESH_REQUIRE_GPU();
  struct Case {
    int n, k;
  };
  for (const Case& c : {Case{128, 128}, Case{576, 2048}, Case{200, 1552}, Case{1, 16}}) {
    for (const bool f32 : {true, false}) {
      const uint32_t seed = t::FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "n=" << c.n << " k=" << c.k << " f32=" << f32 << " seed=" << seed);
      std::mt19937 rng(seed);
      std::vector<float> w = t::Randn(static_cast<size_t>(c.n) * c.k, rng, 0.05f);
      w[0] = 3.0f;  // one outlier: its block's scale, no other's
      if (!f32) w = t::ToFloats(t::ToBf16Rounding(w));
      const int stride = Fp8ScaleStride(c.k);
      MOESH_ASSERT_OK_AND_ASSIGN(auto dq, DeviceBuffer<uint8_t>::Create(w.size()));
      MOESH_ASSERT_OK_AND_ASSIGN(auto ds,
                                 DeviceBuffer<float>::Create(size_t{1} * Fp8Blocks(c.n) * stride));
      MOESH_ASSERT_OK(t::Poison(dq));
      MOESH_ASSERT_OK(t::Poison(ds));
      QuantizeFp8BlocksParams p;
      p.q = dq.get(), p.scale = ds.get(), p.n = c.n, p.k = c.k;
      DeviceBuffer<float> dw32;
      DeviceBuffer<bf16> dw16;
      if (f32) {
        MOESH_ASSERT_OK_AND_ASSIGN(dw32, t::Upload(w));
        p.w_f32 = dw32.get();
      } else {
        MOESH_ASSERT_OK_AND_ASSIGN(dw16, t::Upload(t::ToBf16Rounding(w)));
        p.w_bf16 = dw16.get();
      }
      MOESH_ASSERT_OK(RunQuantizeFp8Blocks(p));
      MOESH_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> q, dq.ToHost());
      MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> s, ds.ToHost());
      std::vector<uint8_t> ref_q(w.size());
      std::vector<float> ref_s(static_cast<size_t>(Fp8Blocks(c.n)) * Fp8Blocks(c.k));
      cpu::QuantizeFp8Blocks(w.data(), ref_q.data(), ref_s.data(), c.n, c.k);
      EXPECT_EQ(q, ref_q);
      for (int j = 0; j < Fp8Blocks(c.n); ++j)
        for (int b = 0; b < Fp8Blocks(c.k); ++b)
          ASSERT_EQ(s[j * stride + b], ref_s[j * Fp8Blocks(c.k) + b]) << j << "," << b;
    }
  }
  QuantizeFp8BlocksParams bad;
  bad.n = 1, bad.k = 16;  // no input
  EXPECT_EQ(RunQuantizeFp8Blocks(bad).code(), absl::StatusCode::kInvalidArgument);
}

// A random activation quantized on the device (the operands' codes and
// scales as the GEMMs read them) and a random weight quantized as a
// checkpoint has it, its scale rows padded as cuBLASLt reads them; the CPU's
// product of the same codes and scales.
struct Fp8Operands {
  DeviceBuffer<bf16> x16;  // x before quantization, [m, k]
  DeviceBuffer<uint8_t> xq, wq;
  DeviceBuffer<float> xs, ws;
  std::vector<uint8_t> w_codes;
  std::vector<float> w_scales;  // [Fp8Blocks(n), Fp8Blocks(k)]

  std::vector<float> Reference(int m, int n, int k) const {
    absl::StatusOr<std::vector<uint8_t>> x = xq.ToHost();
    absl::StatusOr<std::vector<float>> s = xs.ToHost();
    EXPECT_TRUE(x.ok() && s.ok());
    std::vector<float> ref(static_cast<size_t>(m) * n);
    if (!x.ok() || !s.ok()) return ref;
    cpu::Fp8BlockLinear(x->data(), RowMajorScales(*s, m, k).data(), w_codes.data(), w_scales.data(),
                        ref.data(), m, n, k);
    return ref;
  }
};

absl::Status MakeFp8Operands(int m, int n, int k, std::mt19937& rng, Fp8Operands* o) {
  std::vector<float> x = t::Randn(static_cast<size_t>(m) * k, rng);
  const std::vector<float> w = t::Randn(static_cast<size_t>(n) * k, rng, 0.05f);
  o->w_codes.resize(w.size());
  o->w_scales.resize(static_cast<size_t>(Fp8Blocks(n)) * Fp8Blocks(k));
  cpu::QuantizeFp8Blocks(w.data(), o->w_codes.data(), o->w_scales.data(), n, k);
  std::vector<float> padded(static_cast<size_t>(Fp8Blocks(n)) * Fp8ScaleStride(k), 0.0f);
  for (int j = 0; j < Fp8Blocks(n); ++j) {
    std::memcpy(&padded[j * Fp8ScaleStride(k)], &o->w_scales[j * Fp8Blocks(k)],
                Fp8Blocks(k) * sizeof(float));
  }
  ASSIGN_OR_RETURN(o->x16, t::Upload(t::ToBf16Rounding(x)));
  ASSIGN_OR_RETURN(o->wq, t::Upload(o->w_codes));
  ASSIGN_OR_RETURN(o->ws, t::Upload(padded));
  const size_t rows = Fp8Rows(m);
  ASSIGN_OR_RETURN(o->xq, DeviceBuffer<uint8_t>::Create(rows * k));
  ASSIGN_OR_RETURN(o->xs, DeviceBuffer<float>::Create(rows * Fp8Blocks(k)));
  QuantizeFp8Params qp;
  qp.x = o->x16.get(), qp.q = o->xq.get(), qp.scale = o->xs.get(), qp.m = m, qp.k = k;
  RETURN_IF_ERROR(RunQuantizeFp8(qp));
  return CudaStatus(cudaDeviceSynchronize(), "quantize");
}

TEST(Fp8Test, BlockScaledGemmMatchesTheCpu) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(auto gemm, CublasGemm::Create());
  struct Case {
    int m, n, k;
    OutType out;
  };
  // DeepSeek-V3's shapes (q_a + kv_a: 7168 -> 2112; o_proj 16384 -> 7168 cut
  // short) and odd ones: m not a multiple of 4, n not of 128, k not of 128.
  const Case cases[] = {{1, 2112, 7168, OutType::kBf16},
                        {7, 576, 1536, OutType::kFloat32},
                        {33, 640, 2048, OutType::kBf16},
                        {128, 256, 4096, OutType::kFloat32},
                        {5, 200, 1552, OutType::kFloat32}};
  for (const Case& c : cases) {
    const uint32_t seed = t::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "m=" << c.m << " n=" << c.n << " k=" << c.k << " seed=" << seed);
    std::mt19937 rng(seed);
    Fp8Operands o;
    MOESH_ASSERT_OK(MakeFp8Operands(c.m, c.n, c.k, rng, &o));
    const size_t rows = Fp8Rows(c.m);

    Fp8GemmParams p;
    p.x = o.xq.get(), p.x_scale = o.xs.get(), p.w = o.wq.get(), p.w_scale = o.ws.get();
    p.m = c.m, p.n = c.n, p.k = c.k, p.out_type = c.out;
    std::vector<float> out;
    if (c.out == OutType::kFloat32) {
      MOESH_ASSERT_OK_AND_ASSIGN(auto dy, DeviceBuffer<float>::Create(rows * c.n));
      MOESH_ASSERT_OK(t::Poison(dy));
      p.y = dy.get();
      MOESH_ASSERT_OK(gemm->RunFp8(p));
      MOESH_ASSERT_OK_AND_ASSIGN(out, dy.ToHost());
      // y += the same product: twice the first result (a residual add).
      p.accumulate = true;
      MOESH_ASSERT_OK(gemm->RunFp8(p));
      MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> twice, dy.ToHost());
      for (size_t i = 0; i < out.size(); ++i) twice[i] -= out[i];
      EXPECT_LE(t::RelErr(twice, out), 1e-6) << "accumulate";
    } else {
      MOESH_ASSERT_OK_AND_ASSIGN(auto dy, DeviceBuffer<bf16>::Create(rows * c.n));
      MOESH_ASSERT_OK(t::Poison(dy));
      p.y = dy.get();
      MOESH_ASSERT_OK(gemm->RunFp8(p));
      MOESH_ASSERT_OK_AND_ASSIGN(auto yb, dy.ToHost());
      out = t::ToFloats(yb);
    }
    // The reference on the device's own codes and scales.
    // Rows past m (the padding) come out zero.
    for (size_t i = static_cast<size_t>(c.m) * c.n; i < out.size(); ++i) ASSERT_EQ(out[i], 0.0f);
    out.resize(static_cast<size_t>(c.m) * c.n);
    const std::vector<float> ref = o.Reference(c.m, c.n, c.k);
    const double err = t::RelErr(out, ref);
    EXPECT_LE(err, c.out == OutType::kBf16 ? 1e-2 : 2e-3);
    std::cout << "fp8 gemm m=" << c.m << " n=" << c.n << " k=" << c.k << ": rel err " << err
              << std::endl;
  }
}

// The decode-size FP8 linear (RunFp8Gemv) against the CPU on the device's
// own quantized activations: rows of y past m untouched, accumulate adds.
TEST(Fp8Test, GemvMatchesTheCpu) {
  MOESH_REQUIRE_GPU();
  struct Case {
    int m, n, k;
    OutType out;
    bool accumulate;
  };
  // DeepSeek-V3's q_a + kv_a (7168 -> 2112) and o_proj rows; n not a
  // multiple of 16 (a CTA's rows) or 128 (a scale block); k ending in a
  // 64-wide block; every row count up to 8.
  const Case cases[] = {{1, 2112, 7168, OutType::kBf16, false},
                        {8, 576, 1536, OutType::kFloat32, true},
                        {3, 200, 192, OutType::kFloat32, false},
                        {5, 1000, 2048, OutType::kBf16, true},
                        {2, 16, 128, OutType::kFloat32, true},
                        // n above kWideRowsMax: the four-warp form (a partial last CTA).
                        {4, 4104, 384, OutType::kBf16, false}};
  for (const Case& c : cases) {
    const uint32_t seed = t::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "m=" << c.m << " n=" << c.n << " k=" << c.k
                                      << " acc=" << c.accumulate << " seed=" << seed);
    std::mt19937 rng(seed);
    Fp8Operands o;
    MOESH_ASSERT_OK(MakeFp8Operands(c.m, c.n, c.k, rng, &o));
    const std::vector<float> ref = o.Reference(c.m, c.n, c.k);

    // y has m + 1 rows of ldy = n + 3; the last row and the padding columns
    // must come back as they were.
    const int ldy = c.n + 3;
    const size_t y_elems = static_cast<size_t>(c.m + 1) * ldy;
    std::vector<float> y0 = t::Randn(y_elems, rng);
    for (float& v : y0) v = t::RoundBf16(v);  // exact in either output type
    Fp8GemmParams p;
    p.x = o.xq.get(), p.x_scale = o.xs.get(), p.w = o.wq.get(), p.w_scale = o.ws.get();
    p.m = c.m, p.n = c.n, p.k = c.k, p.ldy = ldy, p.out_type = c.out, p.accumulate = c.accumulate;
    // y after one GEMV from y0.
    const auto run = [&](Fp8GemmParams q, std::vector<float>* out) {
      if (c.out == OutType::kFloat32) {
        MOESH_ASSERT_OK_AND_ASSIGN(auto dy, t::Upload(y0));
        q.y = dy.get();
        MOESH_ASSERT_OK(RunFp8Gemv(q));
        MOESH_ASSERT_OK_AND_ASSIGN(*out, dy.ToHost());
      } else {
        std::vector<float> y0_copy = y0;
        MOESH_ASSERT_OK_AND_ASSIGN(auto dy, t::Upload(t::ToBf16Rounding(y0_copy)));
        q.y = dy.get();
        MOESH_ASSERT_OK(RunFp8Gemv(q));
        MOESH_ASSERT_OK_AND_ASSIGN(auto yb, dy.ToHost());
        *out = t::ToFloats(yb);
      }
    };
    std::vector<float> out, fused;
    run(p, &out);
    // x as bf16, quantized inside the GEMV: RunQuantizeFp8's codes and
    // scales, so the same bits of y.
    Fp8GemmParams pb = p;
    pb.x = nullptr, pb.x_scale = nullptr, pb.x_bf16 = o.x16.get(), pb.ldx = c.k;
    run(pb, &fused);
    ASSERT_EQ(fused, out) << "the GEMV's own quantization differs from RunQuantizeFp8's";
    std::vector<float> got(ref.size()), want(ref.size());
    for (int i = 0; i < c.m + 1; ++i) {
      for (int j = 0; j < ldy; ++j) {
        const size_t at = static_cast<size_t>(i) * ldy + j;
        if (i == c.m || j >= c.n) {
          ASSERT_EQ(out[at], y0[at]) << "row " << i << " column " << j << " written";
          continue;
        }
        got[static_cast<size_t>(i) * c.n + j] = out[at] - (c.accumulate ? y0[at] : 0.0f);
        want[static_cast<size_t>(i) * c.n + j] = ref[static_cast<size_t>(i) * c.n + j];
      }
    }
    const double err = t::RelErr(got, want);
    // bf16 out: the accumulated sum is rounded once more; fp32: Hopper's FP8
    // MMA keeps ~13 mantissa bits in its accumulator (cuBLASLt's FP8 GEMM
    // measured 1.3e-4 on this data, BlockScaledGemmMatchesTheCpu's bound).
    EXPECT_LE(err, c.out == OutType::kBf16 ? 2e-2 : 2e-3);
    std::cout << "fp8 gemv m=" << c.m << " n=" << c.n << " k=" << c.k << ": rel err " << err
              << std::endl;
  }
}

// The GEMV's own quantization (x_bf16) against RunQuantizeFp8 + the GEMV on
// the same rows: a row stride past k, an all-zero block, a half block at the
// end; the same bits of y.
TEST(Fp8Test, GemvQuantizesItsInputLikeRunQuantizeFp8) {
  MOESH_REQUIRE_GPU();
  const int m = 3, n = 200, k = 448, ldx = k + 24;
  const uint32_t seed = t::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  Fp8Operands o;
  MOESH_ASSERT_OK(MakeFp8Operands(m, n, k, rng, &o));  // its weights
  std::vector<float> x = t::Randn(static_cast<size_t>(m) * ldx, rng);
  for (int c = 128; c < 256; ++c) x[static_cast<size_t>(1) * ldx + c] = 0.0f;  // a zero block
  MOESH_ASSERT_OK_AND_ASSIGN(auto dx, t::Upload(t::ToBf16Rounding(x)));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dq, DeviceBuffer<uint8_t>::Create(size_t{1} * Fp8Rows(m) * k));
  MOESH_ASSERT_OK_AND_ASSIGN(auto ds,
                             DeviceBuffer<float>::Create(size_t{1} * Fp8Rows(m) * Fp8Blocks(k)));
  QuantizeFp8Params qp;
  qp.x = dx.get(), qp.ldx = ldx, qp.q = dq.get(), qp.scale = ds.get(), qp.m = m, qp.k = k;
  MOESH_ASSERT_OK(RunQuantizeFp8(qp));
  MOESH_ASSERT_OK_AND_ASSIGN(auto y1, DeviceBuffer<float>::Create(size_t{1} * m * n));
  MOESH_ASSERT_OK_AND_ASSIGN(auto y2, DeviceBuffer<float>::Create(size_t{1} * m * n));
  Fp8GemmParams p;
  p.x = dq.get(), p.x_scale = ds.get(), p.w = o.wq.get(), p.w_scale = o.ws.get();
  p.m = m, p.n = n, p.k = k, p.out_type = OutType::kFloat32, p.y = y1.get();
  MOESH_ASSERT_OK(RunFp8Gemv(p));
  Fp8GemmParams f = p;
  f.x = nullptr, f.x_scale = nullptr, f.x_bf16 = dx.get(), f.ldx = ldx, f.y = y2.get();
  MOESH_ASSERT_OK(RunFp8Gemv(f));
  f.ldx = k - 8;  // under k
  EXPECT_EQ(RunFp8Gemv(f).code(), absl::StatusCode::kInvalidArgument);
  MOESH_ASSERT_OK_AND_ASSIGN(const std::vector<float> want, y1.ToHost());
  MOESH_ASSERT_OK_AND_ASSIGN(const std::vector<float> got, y2.ToHost());
  EXPECT_EQ(got, want);
}

// Exactly the CPU's result where every partial sum is exact in any order and
// at the MMA's accumulator width: codes of small integers (0, ±1 .. ±4) and
// power-of-two scales in [2^-6, 2^-4], fed straight to the GEMV (no
// quantize). A fragment, order or scale-index mistake changes the bits.
TEST(Fp8Test, GemvIsExactOnExactlyRepresentableSums) {
  MOESH_REQUIRE_GPU();
  struct Case {
    int m, n, k;
  };
  const Case cases[] = {{1, 2112, 7168}, {8, 200, 1472}, {5, 144, 192}, {3, 16, 64}};
  const uint8_t codes[] = {0x00, 0x38, 0x40, 0x44, 0x48, 0xB8, 0xC0, 0xC4, 0xC8};  // 0, ±1..±4
  for (const Case& c : cases) {
    const uint32_t seed = t::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "m=" << c.m << " n=" << c.n << " k=" << c.k << " seed=" << seed);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> pick(0, 8), pow2(4, 6);
    const int kb = Fp8Blocks(c.k), nb = Fp8Blocks(c.n), rows = Fp8Rows(c.m);
    std::vector<uint8_t> xq(static_cast<size_t>(rows) * c.k, 0), wq(static_cast<size_t>(c.n) * c.k);
    for (size_t i = 0; i < static_cast<size_t>(c.m) * c.k; ++i) xq[i] = codes[pick(rng)];
    for (uint8_t& v : wq) v = codes[pick(rng)];
    // x_scale as the GEMV reads it ([kb, Fp8Rows(m)]) and as the CPU does ([m, kb]).
    std::vector<float> xs_dev(static_cast<size_t>(kb) * rows, 0.0f),
        xs_cpu(static_cast<size_t>(c.m) * kb);
    for (int i = 0; i < c.m; ++i) {
      for (int b = 0; b < kb; ++b) {
        const float v = std::ldexp(1.0f, -pow2(rng));
        xs_dev[static_cast<size_t>(b) * rows + i] = v;
        xs_cpu[static_cast<size_t>(i) * kb + b] = v;
      }
    }
    std::vector<float> ws_cpu(static_cast<size_t>(nb) * kb),
        ws_dev(static_cast<size_t>(nb) * Fp8ScaleStride(c.k), 0.0f);
    for (int j = 0; j < nb; ++j) {
      for (int b = 0; b < kb; ++b) {
        const float v = std::ldexp(1.0f, -pow2(rng));
        ws_cpu[static_cast<size_t>(j) * kb + b] = v;
        ws_dev[static_cast<size_t>(j) * Fp8ScaleStride(c.k) + b] = v;
      }
    }
    std::vector<float> ref(static_cast<size_t>(c.m) * c.n);
    cpu::Fp8BlockLinear(xq.data(), xs_cpu.data(), wq.data(), ws_cpu.data(), ref.data(), c.m, c.n,
                        c.k);
    MOESH_ASSERT_OK_AND_ASSIGN(auto dxq, t::Upload(xq));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dxs, t::Upload(xs_dev));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dwq, t::Upload(wq));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dws, t::Upload(ws_dev));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dy, DeviceBuffer<float>::Create(ref.size()));
    MOESH_ASSERT_OK(t::Poison(dy));
    Fp8GemmParams p;
    p.x = dxq.get(), p.x_scale = dxs.get(), p.w = dwq.get(), p.w_scale = dws.get();
    p.y = dy.get(), p.m = c.m, p.n = c.n, p.k = c.k, p.out_type = OutType::kFloat32;
    MOESH_ASSERT_OK(RunFp8Gemv(p));
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> got, dy.ToHost());
    int mismatches = 0;
    for (size_t i = 0; i < ref.size(); ++i) mismatches += got[i] != ref[i];
    EXPECT_EQ(mismatches, 0) << "of " << ref.size();
  }
}

TEST(Fp8Test, GemvRefusesShapesItIsNotBuiltFor) {
  Fp8GemmParams p;
  p.m = 9, p.n = 16, p.k = 128;  // more rows than kFp8GemvMaxRows
  EXPECT_EQ(RunFp8Gemv(p).code(), absl::StatusCode::kInvalidArgument);
  p.m = 1, p.k = 96;  // not a multiple of 64
  EXPECT_EQ(RunFp8Gemv(p).code(), absl::StatusCode::kInvalidArgument);
  p.k = 128, p.ldy = 8;  // under n
  EXPECT_EQ(RunFp8Gemv(p).code(), absl::StatusCode::kInvalidArgument);
  p.ldy = 0;  // shapes fine, pointers null
  EXPECT_EQ(RunFp8Gemv(p).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moesh::cuda
