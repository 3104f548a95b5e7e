// MLA prefill attention (expanded form; both kernels, mma.sync and wgmma)
// against the plain C++ reference
// (ref/mla_prefill_ref.h), which is itself checked against the CPU engine's
// MLA attention (kernels/cpu/mla_attention.h) on keys and values expanded
// from latent rows by a random kv_b_proj. The launcher's argument checks run
// without a GPU; the kernel's cases skip where none is present.
#include "kernels/cuda/mla_prefill.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/ref/mla_prefill_ref.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::FreshSeed;
using testing::Poison;
using testing::Randn;
using testing::RelErr;
using testing::ToBf16Rounding;
using testing::ToFloats;
using testing::Upload;

constexpr int kNope = mla_prefill::kNopeDim, kRope = mla_prefill::kRopeDim;
constexpr int kQk = kNope + kRope, kV = mla_prefill::kVDim;
constexpr int kLatent = 512, kRow = kLatent + kRope;  // the cache row the rope part sits in
constexpr float kScale = 0.1352f;                     // ~ mscale^2 / sqrt(192), V2-Lite's

TEST(MlaPrefillRefTest, MatchesCpuMlaAttentionOnExpandedKeysAndValues) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  const int heads = 3, rank = 64, len = 90, num_q = 40, q_pos0 = len - num_q;
  const std::vector<float> kv = Randn(static_cast<size_t>(len) * (rank + kRope), rng);
  const std::vector<float> w_kv_b =
      Randn(static_cast<size_t>(heads) * (kNope + kV) * rank, rng, 1.0f / std::sqrt(rank));
  const std::vector<float> q = Randn(static_cast<size_t>(num_q) * heads * kQk, rng);
  // K's no-rope part and V per head: latent · kv_b_proj's rows of the head.
  std::vector<float> k_nope(static_cast<size_t>(len) * heads * kNope),
      v(static_cast<size_t>(len) * heads * kV), k_pe(static_cast<size_t>(len) * kRope);
  for (int j = 0; j < len; ++j) {
    const float* lat = &kv[static_cast<size_t>(j) * (rank + kRope)];
    std::copy(lat + rank, lat + rank + kRope, &k_pe[static_cast<size_t>(j) * kRope]);
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < kNope + kV; ++i) {
        const float* w = &w_kv_b[(static_cast<size_t>(h) * (kNope + kV) + i) * rank];
        double s = 0.0;
        for (int r = 0; r < rank; ++r) s += static_cast<double>(lat[r]) * w[r];
        if (i < kNope) {
          k_nope[(static_cast<size_t>(j) * heads + h) * kNope + i] = static_cast<float>(s);
        } else {
          v[(static_cast<size_t>(j) * heads + h) * kV + i - kNope] = static_cast<float>(s);
        }
      }
    }
  }
  std::vector<float> out(static_cast<size_t>(num_q) * heads * kV), lse(num_q * heads);
  ref::MlaPrefillRefParams r;
  r.q = q.data(), r.k_nope = k_nope.data(), r.k_pe = k_pe.data(), r.v = v.data();
  r.num_q = num_q, r.num_k = len, r.num_heads = heads, r.q_pos0 = q_pos0, r.k_pos0 = 0;
  r.softmax_scale = kScale, r.out = out.data(), r.lse = lse.data();
  ref::MlaPrefillRef(r);

  std::vector<float> cpu_out(out.size());
  cpu::MlaAttentionParams c;
  c.q = q.data(), c.num_q = num_q, c.num_heads = heads, c.qk_nope_head_dim = kNope,
  c.qk_rope_head_dim = kRope, c.kv_lora_rank = rank, c.v_head_dim = kV;
  c.kv = kv.data(), c.num_kv = len, c.q_start_pos = q_pos0, c.w_kv_b = w_kv_b.data();
  c.softmax_scale = kScale, c.out = cpu_out.data();
  cpu::RunMlaAttention(c);
  EXPECT_LE(RelErr(out, cpu_out), 1e-5);

  // Keys split at the query positions: the first query sees only the first
  // q_pos0 + 1 keys, so a range starting past them leaves it with none.
  r.k_pos0 = q_pos0 + 1, r.num_k = len - (q_pos0 + 1);
  r.k_nope = k_nope.data() + static_cast<size_t>(r.k_pos0) * heads * kNope;
  r.k_pe = k_pe.data() + static_cast<size_t>(r.k_pos0) * kRope;
  r.v = v.data() + static_cast<size_t>(r.k_pos0) * heads * kV;
  ref::MlaPrefillRef(r);
  for (int h = 0; h < heads; ++h) {
    EXPECT_EQ(lse[h], -INFINITY);
    EXPECT_EQ(out[static_cast<size_t>(h) * kV], 0.0f);
  }
  EXPECT_TRUE(std::isfinite(lse[static_cast<size_t>(1) * heads]));
}

// Pointers the checks look at but never dereference.
const bf16* FakePointer(uintptr_t address) { return reinterpret_cast<const bf16*>(address); }

MlaPrefillParams ValidArgs() {
  MlaPrefillParams p;
  p.q_nope = FakePointer(256), p.q_pe = FakePointer(512), p.k_nope = FakePointer(1024);
  p.v = FakePointer(2048), p.k_pe = FakePointer(4096);
  p.out = const_cast<bf16*>(FakePointer(8192));
  p.q_nope_ld = p.q_pe_ld = 16 * kQk, p.q_nope_head_stride = p.q_pe_head_stride = kQk;
  p.kv_ld = 16 * kNope, p.kv_head_stride = kNope, p.k_pe_ld = kRow;
  p.out_ld = 16 * kV, p.out_head_stride = kV;
  p.num_q = 0, p.num_k = 10, p.num_heads = 16;
  return p;
}

TEST(MlaPrefillArgsTest, RefusesBadArgumentsBeforeTouchingTheDevice) {
  EXPECT_TRUE(RunMlaPrefill(ValidArgs()).ok());  // no queries: nothing to launch
  auto refused = [](MlaPrefillParams p) {
    return RunMlaPrefill(p).code() == absl::StatusCode::kInvalidArgument;
  };
  MlaPrefillParams p = ValidArgs();
  p.num_heads = 0;
  EXPECT_TRUE(refused(p));
  p = ValidArgs(), p.num_q = -1;
  EXPECT_TRUE(refused(p));
  p = ValidArgs(), p.merge = true;  // merging needs the earlier ranges' lse
  EXPECT_TRUE(refused(p));
  p = ValidArgs(), p.k_nope = FakePointer(1032);  // 8-byte aligned: cp.async needs 16
  EXPECT_TRUE(refused(p));
  p = ValidArgs(), p.k_pe_ld = 580;
  EXPECT_TRUE(refused(p));
  p = ValidArgs(), p.kv_head_stride = 132;
  EXPECT_TRUE(refused(p));
  p = ValidArgs(), p.q_pe_head_stride = 193;
  EXPECT_TRUE(refused(p));
  p = ValidArgs(), p.out = nullptr;
  EXPECT_TRUE(refused(p));
}

TEST(MlaPrefillArgsTest, CountsTheCausallyVisiblePairs) {
  // Four queries after a 2-token prefix over all 6 keys: 3 + 4 + 5 + 6 pairs.
  EXPECT_DOUBLE_EQ(MlaPrefillFlops(4, 6, 2, 2, 0), 2.0 * (kQk + kV) * 18 * 2);
  // Keys [3, 6) only: 0 + 1 + 2 + 3.
  EXPECT_DOUBLE_EQ(MlaPrefillFlops(4, 3, 1, 2, 3), 2.0 * (kQk + kV) * 6);
}

struct PrefillCase {
  const char* name;  // a gtest name: sanitizer runs filter on it
  int num_q, prefix, heads;
  int ranges;       // key ranges the context is cut into (merged calls)
  int first_k = 0;  // keys from this position on only (queries before it see none)
  // The layer stack's query layout (else one [num_q, heads, 192] buffer): the
  // no-rope parts in the q projection's rows (heads · 192 + 576 wide), the
  // roped parts at 512 of [num_q, heads, 576] rows; every other value NaN.
  bool stack_layout = false;
};

const PrefillCase kCases[] = {
    {"OneQuery", 1, 0, 16, 1},
    {"OneTile", 64, 0, 16, 1},
    {"RaggedTiles", 100, 0, 16, 1},
    {"PrefixPaddedTileOddHeads", 130, 37, 20, 1},
    {"PrefixThreeRanges", 257, 1000, 16, 3},
    {"Heads128TwoRanges", 300, 200, 128, 2},
    {"LongPrefixOneRange", 512, 3000, 16, 1},
    {"ShortPromptManyRanges", 70, 5, 16, 4},
    // The first query tile sees no key of the second range (a CTA with no tile).
    {"FirstTileEmptyInLastRange", 200, 0, 16, 2},
    // Queries before position 150 see no key at all: zeros and lse -inf.
    {"EarlyQueriesSeeNoKey", 130, 100, 16, 2, 150},
    {"StackLayoutTwoRanges", 150, 90, 16, 2, 0, true},
    {"StackLayoutHeads128", 129, 0, 128, 1, 0, true},
};

void PrintTo(const PrefillCase& c, std::ostream* os) { *os << c.name; }

class MlaPrefillTest : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(MlaPrefillTest, MatchesReference) {
  MOESH_REQUIRE_GPU();
  const PrefillCase& c = GetParam();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << c.name << " seed=" << seed);
  std::mt19937 rng(seed);
  const int heads = c.heads, num_q = c.num_q, len = c.prefix + c.num_q;
  // The layer stack's layouts: q [num_q, heads, 192] (no-rope then rope
  // part), K's no-rope part and V [len, heads, 128], the rope key inside
  // 576-wide latent rows.
  std::vector<float> q = Randn(static_cast<size_t>(num_q) * heads * kQk, rng);
  std::vector<float> k_nope = Randn(static_cast<size_t>(len) * heads * kNope, rng);
  std::vector<float> v = Randn(static_cast<size_t>(len) * heads * kV, rng);
  std::vector<float> rows = Randn(static_cast<size_t>(len) * kRow, rng);
  const std::vector<bf16> q_b = ToBf16Rounding(q), kn_b = ToBf16Rounding(k_nope),
                          v_b = ToBf16Rounding(v), rows_b = ToBf16Rounding(rows);
  std::vector<float> k_pe(static_cast<size_t>(len) * kRope);
  for (int j = 0; j < len; ++j) {
    std::copy_n(&rows[static_cast<size_t>(j) * kRow + kLatent], kRope, &k_pe[j * size_t{kRope}]);
  }

  std::vector<float> want(static_cast<size_t>(num_q) * heads * kV), want_lse(num_q * heads);
  ref::MlaPrefillRefParams r;
  r.q = q.data(), r.k_nope = k_nope.data(), r.k_pe = k_pe.data(), r.v = v.data();
  r.num_q = num_q, r.num_k = len - c.first_k, r.num_heads = heads, r.q_pos0 = c.prefix;
  r.k_pos0 = c.first_k, r.k_nope = k_nope.data() + static_cast<size_t>(c.first_k) * heads * kNope;
  r.k_pe = k_pe.data() + static_cast<size_t>(c.first_k) * kRope;
  r.v = v.data() + static_cast<size_t>(c.first_k) * heads * kV;
  r.softmax_scale = kScale, r.out = want.data(), r.lse = want_lse.data();
  ref::MlaPrefillRef(r);

  // The queries as the layer stack lays them out, NaN wherever
  // the kernels must not read.
  const int64_t stack_q_ld = static_cast<int64_t>(heads) * kQk + kRow, stack_pe_ld = heads * kRow;
  std::vector<bf16> q_rows(static_cast<size_t>(num_q) * stack_q_ld, testing::ToBf16(NAN)),
      pe_rows(static_cast<size_t>(num_q) * stack_pe_ld, testing::ToBf16(NAN));
  for (int i = 0; i < num_q; ++i) {
    for (int h = 0; h < heads; ++h) {
      const bf16* src = &q_b[(static_cast<size_t>(i) * heads + h) * kQk];
      std::copy_n(src, kNope, &q_rows[i * stack_q_ld + h * kQk]);
      std::copy_n(src + kNope, kRope, &pe_rows[i * stack_pe_ld + h * kRow + kLatent]);
    }
  }
  MOESH_ASSERT_OK_AND_ASSIGN(auto dq, Upload(c.stack_layout ? q_rows : q_b));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dpe, Upload(pe_rows));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dkn, Upload(kn_b));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dv, Upload(v_b));
  MOESH_ASSERT_OK_AND_ASSIGN(auto drows, Upload(rows_b));
  for (const MlaPrefillImpl impl : {MlaPrefillImpl::kMmaSync, MlaPrefillImpl::kWgmma}) {
    const char* impl_name = impl == MlaPrefillImpl::kWgmma ? "wgmma" : "mma.sync";
    SCOPED_TRACE(impl_name);
    DeviceBuffer<bf16> dout;
    DeviceBuffer<float> dlse;
    MOESH_ASSERT_OK(dout.Reallocate(want.size()));
    MOESH_ASSERT_OK(dlse.Reallocate(want_lse.size()));
    MOESH_ASSERT_OK(Poison(dout));
    MOESH_ASSERT_OK(Poison(dlse));

    MlaPrefillParams p;
    p.q_nope = dq.get(), p.q_pe = dq.get() + kNope;
    p.q_nope_ld = p.q_pe_ld = static_cast<int64_t>(heads) * kQk;
    p.q_nope_head_stride = p.q_pe_head_stride = kQk;
    if (c.stack_layout) {
      p.q_nope_ld = stack_q_ld;
      p.q_pe = dpe.get() + kLatent, p.q_pe_ld = stack_pe_ld, p.q_pe_head_stride = kRow;
    }
    p.kv_ld = static_cast<int64_t>(heads) * kNope, p.kv_head_stride = kNope, p.k_pe_ld = kRow;
    p.num_q = num_q, p.num_heads = heads, p.q_pos0 = c.prefix, p.softmax_scale = kScale;
    p.out = dout.get(), p.out_ld = static_cast<int64_t>(heads) * kV, p.out_head_stride = kV;
    p.lse = dlse.get(), p.impl = impl;
    const int keys = len - c.first_k;
    for (int range = 0; range < c.ranges; ++range) {
      const int k0 = c.first_k + static_cast<int>(static_cast<int64_t>(keys) * range / c.ranges);
      const int k1 =
          c.first_k + static_cast<int>(static_cast<int64_t>(keys) * (range + 1) / c.ranges);
      p.k_nope = dkn.get() + static_cast<size_t>(k0) * heads * kNope;
      p.v = dv.get() + static_cast<size_t>(k0) * heads * kV;
      p.k_pe = drows.get() + static_cast<size_t>(k0) * kRow + kLatent;
      p.num_k = k1 - k0, p.k_pos0 = k0, p.merge = range > 0;
      MOESH_ASSERT_OK(RunMlaPrefill(p));
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<bf16> got_b(want.size());
    std::vector<float> got_lse(want_lse.size());
    ASSERT_EQ(cudaMemcpy(got_b.data(), dout.get(), dout.bytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpy(got_lse.data(), dlse.get(), dlse.bytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    const std::vector<float> got = ToFloats(got_b);

    double worst = 0.0, worst_lse = 0.0;
    int unseen = 0;  // rows that see no key
    for (int i = 0; i < num_q; ++i) {
      for (int h = 0; h < heads; ++h) {
        const size_t row = static_cast<size_t>(i) * heads + h;
        const std::vector<float> a(got.begin() + row * kV, got.begin() + (row + 1) * kV);
        const std::vector<float> b(want.begin() + row * kV, want.begin() + (row + 1) * kV);
        if (want_lse[row] == -INFINITY) {  // no key: exactly zeros and -inf
          ++unseen;
          EXPECT_EQ(got_lse[row], -INFINITY) << "row " << i << " head " << h;
          EXPECT_EQ(*std::max_element(a.begin(), a.end()), 0.0f) << "row " << i << " head " << h;
          EXPECT_EQ(*std::min_element(a.begin(), a.end()), 0.0f) << "row " << i << " head " << h;
          continue;
        }
        const double e = RelErr(a, b);
        // The kernel's lse is base 2 of the scaled scores: ln = log2 · ln 2. A
        // NaN (an unwritten, poisoned lse) counts as an infinite error.
        const double e_lse =
            std::fabs(static_cast<double>(got_lse[row]) * std::log(2.0) - want_lse[row]);
        worst = std::isnan(e) ? INFINITY : std::max(worst, e);
        worst_lse = std::isnan(e_lse) ? INFINITY : std::max(worst_lse, e_lse);
      }
    }
    std::printf("%s (%s): worst per-row rel err %.3e, worst |lse err| %.3e, %d rows see no key\n",
                c.name, impl_name, worst, worst_lse, unseen);
    EXPECT_EQ(unseen > 0, c.first_k > c.prefix);
    EXPECT_LE(worst, 1e-2);
    EXPECT_LE(worst_lse, 5e-3);
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaPrefillTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<PrefillCase>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace moesh::cuda
