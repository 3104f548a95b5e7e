// DeepSeek-V4's mHC mapping (RunMhcPre, the Sinkhorn on a warp) against
// kernels/cpu/mhc.h at every stream count it accepts, and the slice copy's
// two forms (16-byte chunks, 2-byte values) against a host copy. The
// attention-side V4 ops are covered through the model (cuda_model_test's V4
// cases against the CPU engine).
#include "kernels/cuda/v4_ops.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/mhc.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::FreshSeed;
using testing::Randn;
using testing::Upload;

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  return worst;
}

struct MhcCase {
  int hc, tokens, iters;
  bool head;
  int hidden = 96;  // not a multiple of 4: the kernel's scalar form
};

class MhcPreTest : public ::testing::TestWithParam<MhcCase> {};

TEST_P(MhcPreTest, MatchesTheCpuReference) {
  MOESH_REQUIRE_GPU();
  const MhcCase k = GetParam();
  const int hidden = k.hidden, width = k.hc * hidden;
  const int n_mix = k.head ? k.hc : (2 + k.hc) * k.hc;
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "hc " << k.hc << " hidden " << hidden << " seed " << seed);
  std::mt19937 rng(seed);
  const std::vector<float> x = Randn(static_cast<size_t>(k.tokens) * width, rng);
  const std::vector<float> fn = Randn(static_cast<size_t>(n_mix) * width, rng, 0.05f);
  const std::vector<float> base = Randn(n_mix, rng, 0.5f);
  const std::vector<float> scale = {0.9f, 1.1f, 1.3f};
  // The GPU op takes mix = flatten(x) · fn^T (the model's fp32 GEMM).
  std::vector<float> mix(static_cast<size_t>(k.tokens) * n_mix);
  for (int t = 0; t < k.tokens; ++t) {
    for (int o = 0; o < n_mix; ++o) {
      double acc = 0.0;
      for (int j = 0; j < width; ++j)
        acc += static_cast<double>(x[static_cast<size_t>(t) * width + j]) *
               fn[static_cast<size_t>(o) * width + j];
      mix[static_cast<size_t>(t) * n_mix + o] = static_cast<float>(acc);
    }
  }
  std::vector<float> collapsed(static_cast<size_t>(k.tokens) * hidden);
  std::vector<float> post(static_cast<size_t>(k.tokens) * k.hc);
  std::vector<float> comb(static_cast<size_t>(k.tokens) * k.hc * k.hc);
  if (k.head) {
    cpu::MhcHeadParams c;
    c.x = x.data(), c.num_tokens = k.tokens, c.hc = k.hc, c.hidden = hidden;
    c.fn = fn.data(), c.base = base.data(), c.scale = scale.data(), c.out = collapsed.data();
    cpu::RunMhcHead(c);
  } else {
    cpu::MhcPreParams c;
    c.x = x.data(), c.num_tokens = k.tokens, c.hc = k.hc, c.hidden = hidden;
    c.fn = fn.data(), c.base = base.data(), c.scale = scale.data();
    c.sinkhorn_iters = k.iters;
    c.collapsed = collapsed.data(), c.post = post.data(), c.comb = comb.data();
    cpu::RunMhcPre(c);
  }
  MOESH_ASSERT_OK_AND_ASSIGN(auto dx, Upload(x));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dmix, Upload(mix));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dbase, Upload(base));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dscale, Upload(scale));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dcollapsed, DeviceBuffer<float>::Create(collapsed.size()));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dpost, DeviceBuffer<float>::Create(post.size()));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dcomb, DeviceBuffer<float>::Create(comb.size()));
  MhcPreParams p;
  p.x = dx.get(), p.mix = dmix.get(), p.base = dbase.get(), p.scale = dscale.get();
  p.num_tokens = k.tokens, p.hc = k.hc, p.hidden = hidden, p.head = k.head;
  p.sinkhorn_iters = k.iters;
  p.collapsed = dcollapsed.get(), p.post = dpost.get(), p.comb = dcomb.get();
  ASSERT_TRUE(RunMhcPre(p).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  MOESH_ASSERT_OK_AND_ASSIGN(const std::vector<float> got_collapsed, dcollapsed.ToHost());
  EXPECT_LE(MaxAbsDiff(got_collapsed, collapsed), 1e-4);
  if (k.head) return;
  MOESH_ASSERT_OK_AND_ASSIGN(const std::vector<float> got_post, dpost.ToHost());
  MOESH_ASSERT_OK_AND_ASSIGN(const std::vector<float> got_comb, dcomb.ToHost());
  EXPECT_LE(MaxAbsDiff(got_post, post), 1e-5);
  EXPECT_LE(MaxAbsDiff(got_comb, comb), 1e-5);
  // Sinkhorn's result: every column sums to ~1 (the last normalisation).
  for (int t = 0; t < k.tokens; ++t) {
    for (int col = 0; col < k.hc; ++col) {
      double sum = 0.0;
      for (int j = 0; j < k.hc; ++j)
        sum += got_comb[(static_cast<size_t>(t) * k.hc + j) * k.hc + col];
      EXPECT_NEAR(sum, 1.0, 1e-4) << "token " << t << " column " << col;
    }
  }
}

// hc 6 to 8: comb's entries past 32 live in the lanes' second slots.
INSTANTIATE_TEST_SUITE_P(Streams, MhcPreTest,
                         ::testing::Values(MhcCase{1, 3, 20, false}, MhcCase{3, 2, 1, false},
                                           MhcCase{4, 5, 20, false}, MhcCase{6, 2, 20, false},
                                           MhcCase{8, 3, 20, false}, MhcCase{4, 3, 20, false, 30},
                                           MhcCase{4, 3, 1, true}, MhcCase{8, 2, 1, true},
                                           MhcCase{3, 2, 1, true, 30}));

TEST(SliceCopyTest, ChunkedAndElementwiseFormsMatchAHostCopy) {
  MOESH_REQUIRE_GPU();
  struct Case {
    int tokens, rows, dim, src_row, src_off, dst_row, dst_off;
  };
  // The first two copy 16-byte chunks (everything a multiple of 8 values),
  // the others value by value (an odd offset, an odd width).
  const Case cases[] = {{1, 64, 512, 512, 0, 576, 0},
                        {5, 3, 64, 80, 16, 72, 8},
                        {3, 4, 64, 72, 3, 64, 0},
                        {2, 5, 7, 9, 1, 11, 2}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "dim " << c.dim << " src_off " << c.src_off);
    const int src_tok = c.rows * c.src_row + 8, dst_tok = c.rows * c.dst_row + 8;
    std::vector<bf16> src(static_cast<size_t>(c.tokens) * src_tok),
        dst(static_cast<size_t>(c.tokens) * dst_tok);
    for (size_t i = 0; i < src.size(); ++i) src[i] = testing::ToBf16(static_cast<float>(i % 251));
    for (bf16& v : dst) v = testing::ToBf16(-1.0f);
    std::vector<bf16> want = dst;
    for (int t = 0; t < c.tokens; ++t) {
      for (int r = 0; r < c.rows; ++r) {
        for (int i = 0; i < c.dim; ++i) {
          want[static_cast<size_t>(t) * dst_tok + r * c.dst_row + c.dst_off + i] =
              src[static_cast<size_t>(t) * src_tok + r * c.src_row + c.src_off + i];
        }
      }
    }
    MOESH_ASSERT_OK_AND_ASSIGN(auto dsrc, Upload(src));
    MOESH_ASSERT_OK_AND_ASSIGN(auto ddst, Upload(dst));
    SliceCopyParams p;
    p.src = dsrc.get(), p.src_token_stride = src_tok, p.src_row_stride = c.src_row,
    p.src_offset = c.src_off;
    p.dst = ddst.get(), p.dst_token_stride = dst_tok, p.dst_row_stride = c.dst_row,
    p.dst_offset = c.dst_off;
    p.num_tokens = c.tokens, p.num_rows = c.rows, p.dim = c.dim;
    ASSERT_TRUE(RunSliceCopy(p).ok());
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    MOESH_ASSERT_OK_AND_ASSIGN(const std::vector<bf16> got, ddst.ToHost());
    EXPECT_EQ(testing::ToFloats(got), testing::ToFloats(want));
  }
}

}  // namespace
}  // namespace moesh::cuda
