// The GPU's MXFP4 quantization against kernels/cpu/mxfp4, bit for bit.
#include "kernels/cuda/mxfp4.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"
#include "kernels/cpu/mxfp4.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

namespace t = testing;

TEST(Mxfp4Test, QuantizeMatchesTheCpuBitForBit) {
  MOESH_REQUIRE_GPU();
  struct Case {
    int n, k;
  };
  for (const Case& c : {Case{1, 32}, Case{7, 7168}, Case{64, 2048}, Case{3, 96}}) {
    const uint32_t seed = t::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " k=" << c.k << " seed=" << seed);
    std::mt19937 rng(seed);
    std::vector<float> w = t::Randn(static_cast<size_t>(c.n) * c.k, rng, 0.05f);
    // Blocks the rounding and the scale choice are tested on: all zeros, a
    // NaN, an infinity, tiny and huge magnitudes, exact grid points and ties.
    const int blocks = c.n * c.k / 32;
    auto block = [&](int b) { return &w[static_cast<size_t>(b % blocks) * 32]; };
    for (int i = 0; i < 32; ++i) block(1)[i] = 0.0f;
    block(2)[5] = std::numeric_limits<float>::quiet_NaN();
    block(3)[7] = -std::numeric_limits<float>::infinity();
    for (int i = 0; i < 32; ++i) block(4)[i] *= 1e-30f;
    for (int i = 0; i < 32; ++i) block(5)[i] *= 1e30f;
    const float grid[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f,
                          2.0f, 2.5f,  3.0f, 3.5f,  4.0f, 5.0f,  6.0f, -2.5f};
    for (int i = 0; i < 16; ++i) block(6)[i] = grid[i];  // amax 6: scale 1, ties at the midpoints
    // The CPU reference on the bf16 values the GPU reads (w rounded to them).
    const std::vector<bf16> wb = t::ToBf16Rounding(w);
    std::vector<uint8_t> ref_q(static_cast<size_t>(c.n) * c.k / 2), ref_s(blocks);
    cpu::QuantizeMxfp4(w.data(), ref_q.data(), ref_s.data(), c.n, c.k);

    MOESH_ASSERT_OK_AND_ASSIGN(auto dw, t::Upload(wb));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dq, DeviceBuffer<uint8_t>::Create(ref_q.size()));
    MOESH_ASSERT_OK_AND_ASSIGN(auto ds, DeviceBuffer<uint8_t>::Create(ref_s.size()));
    MOESH_ASSERT_OK(t::Poison(dq));
    MOESH_ASSERT_OK(t::Poison(ds));
    QuantizeMxfp4Params p;
    p.w = dw.get(), p.q = dq.get(), p.scale = ds.get(), p.n = c.n, p.k = c.k;
    MOESH_ASSERT_OK(RunQuantizeMxfp4(p));
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> q, dq.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<uint8_t> s, ds.ToHost());
    EXPECT_EQ(q, ref_q);
    EXPECT_EQ(s, ref_s);
  }
  QuantizeMxfp4Params bad;
  bad.n = 1, bad.k = 48;  // not a multiple of 32
  EXPECT_EQ(RunQuantizeMxfp4(bad).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moesh::cuda
