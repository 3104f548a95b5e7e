// The MoE permutation, grouped GEMM and combine against plain C++ on fresh
// random inputs: ragged expert loads (empty experts included), gathered and
// contiguous rows, every tile height, bf16 and fp32 outputs. Then the whole
// expert MLP (EnqueueExpertMlp) both ways — grouped kernel and per-expert
// dense GEMMs — against the same reference.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "base/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/mxfp4.h"
#include "kernels/cuda/expert_mlp.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/random_topk.h"
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

struct Case {
  int tokens, top_k, experts, used_experts, n, k, tile_m;
  bool gather;
  OutType out;
  int k_tile = 0;  // 0: the kernel's choice (64 iff k % 64 == 0)
};

TEST(GroupedGemmTest, PermuteGemmCombineMatchReference) {
  MOESH_REQUIRE_GPU();
  const Case cases[] = {
      {1, 6, 64, 64, 2816, 2048, 16, true, OutType::kBf16},  // V2-Lite decode, batch 1
      {37, 6, 64, 20, 264, 256, 16, true,
       OutType::kFloat32},  // empty experts, n not a tile multiple
      {256, 6, 64, 64, 512, 1408, 32, false,
       OutType::kFloat32},  // V2-Lite down at batch 256 (k = 1408)
      {128, 6, 64, 64, 2816, 2048, 16, true, OutType::kBf16},  // V2-Lite gate_up at batch 128
      {64, 6, 16, 16, 264, 512, 32, true, OutType::kBf16},     // 32-row tiles (MXFP4 256 wide)
      {8, 6, 16, 16, 264, 1408, 16, true, OutType::kBf16},     // MXFP4 128 wide (k % 256 != 0)
      {300, 4, 8, 5, 136, 96, 64, true, OutType::kBf16},       // prefill tiles, 32-wide k slices
      {300, 4, 8, 5, 136, 128, 64, true, OutType::kFloat32},   // prefill tiles, 64-wide k slices
      {100, 6, 16, 16, 264, 512, 32, true, OutType::kFloat32, 32},  // 32-wide slices forced
      {50, 6, 16, 16, 264, 512, 16, true, OutType::kBf16, 32},
      {3, 2, 8, 8, 64, 32, 16, true, OutType::kFloat32},  // golden sizes
  };
  Stream stream;
  MOESH_ASSERT_OK_AND_ASSIGN(stream, Stream::Create());
  for (const Case& c : cases) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "tokens=" << c.tokens << " E=" << c.experts << " n=" << c.n << " k=" << c.k
                 << " tile_m=" << c.tile_m << " k_tile=" << c.k_tile << " seed=" << seed);
    std::mt19937 rng(seed);
    const int pairs = c.tokens * c.top_k;
    // Distinct experts per token, drawn from the first used_experts.
    const std::vector<int32_t> ids = UniformTopkIds(c.tokens, c.top_k, c.used_experts, rng);
    std::vector<float> x = Randn(static_cast<size_t>(c.gather ? c.tokens : pairs) * c.k, rng);
    std::vector<float> w = Randn(static_cast<size_t>(c.experts) * c.n * c.k, rng, 0.05f);
    MOESH_ASSERT_OK_AND_ASSIGN(auto dids, Upload(ids));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dx, Upload(ToBf16Rounding(x)));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dw, Upload(ToBf16Rounding(w)));
    MOESH_ASSERT_OK_AND_ASSIGN(auto offsets, DeviceBuffer<int32_t>::Create(c.experts + 1));
    MOESH_ASSERT_OK_AND_ASSIGN(auto tiles, DeviceBuffer<int32_t>::Create(c.experts + 1));
    MOESH_ASSERT_OK_AND_ASSIGN(auto row_token, DeviceBuffer<int32_t>::Create(pairs));
    MOESH_ASSERT_OK_AND_ASSIGN(auto pair_row, DeviceBuffer<int32_t>::Create(pairs));
    MOESH_ASSERT_OK_AND_ASSIGN(auto counts, DeviceBuffer<int32_t>::Create(c.experts));
    MOESH_ASSERT_OK(Poison(row_token));
    MOESH_ASSERT_OK(Poison(pair_row));
    // The ops run on a non-blocking stream, which does not wait for the legacy stream's memsets.
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    MoePermuteParams pp;
    pp.topk_ids = dids.get(), pp.num_tokens = c.tokens, pp.top_k = c.top_k,
    pp.num_experts = c.experts;
    pp.tile_m = c.tile_m, pp.expert_offsets = offsets.get(), pp.tile_offsets = tiles.get();
    pp.row_token = row_token.get(), pp.pair_row = pair_row.get(), pp.expert_counts = counts.get();
    pp.stream = stream.get();
    MOESH_ASSERT_OK(RunMoePermute(pp));

    const bool f32 = c.out == OutType::kFloat32;
    MOESH_ASSERT_OK_AND_ASSIGN(
        auto y, DeviceBuffer<uint8_t>::Create(static_cast<size_t>(pairs) * c.n * (f32 ? 4 : 2)));
    MOESH_ASSERT_OK(Poison(y));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    GroupedGemmParams gp;
    gp.x = dx.get(), gp.ldx = c.k, gp.row_index = c.gather ? row_token.get() : nullptr;
    gp.w = dw.get(), gp.num_experts = c.experts, gp.n = c.n, gp.k = c.k;
    gp.expert_offsets = offsets.get(), gp.tile_offsets = tiles.get(), gp.tile_m = c.tile_m;
    gp.max_tiles = GroupedGemmMaxTiles(pairs, c.experts, c.tile_m);
    gp.k_tile = c.k_tile;
    gp.y = y.get(), gp.out_type = c.out, gp.stream = stream.get();
    MOESH_ASSERT_OK(RunGroupedGemm(gp));
    MOESH_ASSERT_OK(stream.Synchronize());

    MOESH_ASSERT_OK_AND_ASSIGN(auto h_off, offsets.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(auto h_tiles, tiles.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(auto h_rt, row_token.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(auto h_pr, pair_row.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(auto h_counts, counts.ToHost());
    // The permutation: counts, offsets, tiles, and every pair at a row of its expert.
    std::vector<int> want_counts(c.experts, 0);
    for (int32_t id : ids) want_counts[id]++;
    int at = 0, tile_at = 0;
    for (int e = 0; e < c.experts; ++e) {
      ASSERT_EQ(h_counts[e], want_counts[e]) << "expert " << e;
      ASSERT_EQ(h_off[e], at);
      ASSERT_EQ(h_tiles[e], tile_at);
      at += want_counts[e];
      tile_at += (want_counts[e] + c.tile_m - 1) / c.tile_m;
    }
    ASSERT_EQ(h_off[c.experts], pairs);
    ASSERT_EQ(h_tiles[c.experts], tile_at);
    std::vector<int> expert_of_row(pairs);
    for (int e = 0; e < c.experts; ++e) {
      for (int r = h_off[e]; r < h_off[e + 1]; ++r) expert_of_row[r] = e;
    }
    std::vector<int> seen(pairs, 0);
    for (int i = 0; i < pairs; ++i) {
      const int r = h_pr[i];
      ASSERT_GE(r, 0);
      ASSERT_LT(r, pairs);
      ASSERT_EQ(seen[r]++, 0) << "row " << r << " taken twice";
      ASSERT_EQ(h_rt[r], i / c.top_k);
      ASSERT_EQ(expert_of_row[r], ids[i]);
    }

    // The GEMM.
    std::vector<float> ref(static_cast<size_t>(pairs) * c.n);
    for (int r = 0; r < pairs; ++r) {
      const float* xr = &x[static_cast<size_t>(c.gather ? h_rt[r] : r) * c.k];
      const float* we = &w[static_cast<size_t>(expert_of_row[r]) * c.n * c.k];
      for (int j = 0; j < c.n; ++j) {
        double acc = 0.0;
        for (int kk = 0; kk < c.k; ++kk)
          acc += static_cast<double>(xr[kk]) * we[static_cast<size_t>(j) * c.k + kk];
        ref[static_cast<size_t>(r) * c.n + j] = static_cast<float>(acc);
      }
    }
    auto floats = [&](const std::vector<uint8_t>& raw) {  // y's bytes as floats
      if (f32) {
        std::vector<float> v(ref.size());
        std::memcpy(v.data(), raw.data(), v.size() * 4);
        return v;
      }
      std::vector<bf16> h(ref.size());
      std::memcpy(h.data(), raw.data(), h.size() * 2);
      return ToFloats(h);
    };
    MOESH_ASSERT_OK_AND_ASSIGN(auto y_raw, y.ToHost());
    const std::vector<float> got = floats(y_raw);
    const double err = RelErr(got, ref);
    EXPECT_LT(err, f32 ? 2e-3 : 6e-3) << "grouped GEMM";

    // `q` (quantized weights) against the bf16 kernel on `wide`, the values
    // q's weights widen to, run into y (checked above already): the same
    // bytes out, bit for bit — but for the experiment MOESH_EXP_MXFP4_KSPLIT
    // (grouped_gemm.cu), whose 16-row MXFP4 tiles sum each slice's two
    // halves apart and add them at the end: there the same values within
    // fp32 (bf16) rounding (exact_sums false).
    // x_wide: the bf16 kernel's activations (null: gp's).
    auto ExpectWidensTo = [&](GroupedGemmParams q, const std::vector<bf16>& wide, const char* what,
                              const bf16* x_wide = nullptr, bool exact_sums = true) {
      MOESH_ASSERT_OK_AND_ASSIGN(auto dwide, Upload(wide));
      MOESH_ASSERT_OK_AND_ASSIGN(auto yq, DeviceBuffer<uint8_t>::Create(y.size()));
      MOESH_ASSERT_OK(Poison(yq));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      q.y = yq.get();
      MOESH_ASSERT_OK(RunGroupedGemm(q));
      GroupedGemmParams g16 = gp;
      g16.w = dwide.get();
      if (x_wide != nullptr) g16.x = x_wide;
      MOESH_ASSERT_OK(RunGroupedGemm(g16));
      MOESH_ASSERT_OK(stream.Synchronize());
      MOESH_ASSERT_OK_AND_ASSIGN(auto a, yq.ToHost());
      MOESH_ASSERT_OK_AND_ASSIGN(auto b, y.ToHost());
      if (!exact_sums) {  // the same products, summed in another order
        const double diff = RelErr(floats(a), floats(b));
        EXPECT_LT(diff, f32 ? 1e-5 : 2e-3) << what << " weights against their bf16 widening";
        return;
      }
      EXPECT_TRUE(a == b) << what << " weights differ from their bf16 widening";
    };
    // FP8 weights (each expert's 128 x 128 blocks quantized as a checkpoint
    // holds them): bit for bit the bf16 kernel on the codes times their
    // scales rounded to bf16, which the kernel widens them to.
    {
      const int stride = Fp8ScaleStride(c.k), nb = cpu::Fp8Blocks(c.n);
      std::vector<uint8_t> codes(w.size());
      std::vector<float> scales(static_cast<size_t>(c.experts) * nb * stride, 0.0f);
      std::vector<float> widened(w.size());
      std::vector<float> block(static_cast<size_t>(nb) * cpu::Fp8Blocks(c.k));
      for (int e = 0; e < c.experts; ++e) {
        const size_t at = static_cast<size_t>(e) * c.n * c.k;
        cpu::QuantizeFp8Blocks(&w[at], &codes[at], block.data(), c.n, c.k);
        for (int j = 0; j < nb; ++j) {
          for (int b = 0; b < cpu::Fp8Blocks(c.k); ++b)
            scales[(static_cast<size_t>(e) * nb + j) * stride + b] =
                block[j * cpu::Fp8Blocks(c.k) + b];
        }
        for (int r = 0; r < c.n; ++r) {
          for (int kk = 0; kk < c.k; ++kk) {
            const size_t i = at + static_cast<size_t>(r) * c.k + kk;
            widened[i] = Bf16ToF32(F32ToBf16(F8E4M3ToF32(codes[i]) *
                                             block[(r / 128) * cpu::Fp8Blocks(c.k) + kk / 128]));
          }
        }
      }
      MOESH_ASSERT_OK_AND_ASSIGN(auto dcodes, Upload(codes));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dscales, Upload(scales));
      GroupedGemmParams g8 = gp;
      g8.w = nullptr, g8.w_fp8 = dcodes.get(), g8.w_scale = dscales.get();
      ExpectWidensTo(g8, ToBf16Rounding(widened), "FP8");
      g8.w_scale = nullptr;
      EXPECT_EQ(RunGroupedGemm(g8).code(), absl::StatusCode::kInvalidArgument);
    }
    // MXFP4 weights (each expert quantized as DeepSeek-V4 ships its routed
    // experts): bit for bit the bf16 kernel on the dequantized values, which
    // bf16 holds exactly, with x's and w's inputs in the order the MXFP4
    // kernel sums them (Mxfp4MmaInput). About one scale in sixteen is moved
    // to 2^-127 (the weights bf16 subnormals) or past 2^1 (the kernel's
    // two-multiply path), so warps take both paths.
    {
      std::vector<uint8_t> packed(w.size() / 2), mx(w.size() / cpu::kMxfp4Block);
      std::vector<float> dequantized(w.size());
      cpu::QuantizeMxfp4(w.data(), packed.data(), mx.data(), c.experts * c.n, c.k);
      for (uint8_t& e : mx) {
        if (rng() % 16 == 0) e = std::array<uint8_t, 4>{0, 129, 131, 200}[rng() % 4];
      }
      cpu::DequantizeMxfp4(packed.data(), mx.data(), dequantized.data(), c.experts * c.n, c.k);
      auto mma_order = [&](const std::vector<float>& v) {  // each row's 32-input groups
        std::vector<float> o(v.size());
        for (size_t g = 0; g < v.size(); g += 32) {
          for (int slot = 0; slot < 32; ++slot) o[g + slot] = v[g + Mxfp4MmaInput(slot)];
        }
        return o;
      };
      std::vector<float> w_order = mma_order(dequantized), x_order = mma_order(x);
      const std::vector<bf16> wide = ToBf16Rounding(w_order);
      ASSERT_TRUE(w_order == mma_order(dequantized)) << "e2m1 times a power of two is a bf16";
      MOESH_ASSERT_OK_AND_ASSIGN(auto dx_order, Upload(ToBf16Rounding(x_order)));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dpacked, Upload(packed));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dmx, Upload(mx));
      GroupedGemmParams g4 = gp;
      g4.w = nullptr, g4.w_fp4 = dpacked.get(), g4.w_mx_scale = dmx.get();
      const bool k_split = std::getenv("MOESH_EXP_MXFP4_KSPLIT") != nullptr && c.tile_m == 16 &&
                           c.k % 256 == 0 && c.k_tile == 0;
      ExpectWidensTo(g4, wide, "MXFP4", dx_order.get(), !k_split);
      g4.w_mx_scale = dmx.get() + 1;  // a slice's scales are read a row at once
      EXPECT_EQ(RunGroupedGemm(g4).code(), absl::StatusCode::kInvalidArgument);
      g4.w_mx_scale = nullptr;
      EXPECT_EQ(RunGroupedGemm(g4).code(), absl::StatusCode::kInvalidArgument);
    }
    if (f32) {  // y again as the bf16 weights' result, for the combine below
      MOESH_ASSERT_OK(RunGroupedGemm(gp));
      MOESH_ASSERT_OK(stream.Synchronize());
    }

    // The combine: x2[t] += sum_k wt[t, k] * y[pair_row[t, k]] (fp32 rows).
    if (f32) {
      std::vector<float> wt = Randn(pairs, rng, 0.3f),
                         base = Randn(static_cast<size_t>(c.tokens) * c.n, rng);
      std::vector<float> want = base;
      for (int t = 0; t < c.tokens; ++t) {
        for (int kk = 0; kk < c.top_k; ++kk) {
          const int r = h_pr[t * c.top_k + kk];
          for (int j = 0; j < c.n; ++j) {
            want[static_cast<size_t>(t) * c.n + j] +=
                wt[t * c.top_k + kk] * got[static_cast<size_t>(r) * c.n + j];
          }
        }
      }
      MOESH_ASSERT_OK_AND_ASSIGN(auto dwt, Upload(wt));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dbase, Upload(base));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      MoeCombineParams cp;
      cp.expert_out = reinterpret_cast<const float*>(y.get()), cp.pair_row = pair_row.get(),
      cp.topk_weights = dwt.get();
      cp.num_tokens = c.tokens, cp.top_k = c.top_k, cp.hidden = c.n, cp.x = dbase.get(),
      cp.stream = stream.get();
      MOESH_ASSERT_OK(RunMoeCombine(cp));
      MOESH_ASSERT_OK(stream.Synchronize());
      MOESH_ASSERT_OK_AND_ASSIGN(auto combined, dbase.ToHost());
      EXPECT_LT(RelErr(combined, want), 1e-5) << "combine";
      // With overwrite: x2[t] = the sum, x2's old values (NaN here) never read.
      std::vector<float> sum(want.size());
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = want[i] - base[i];
      std::vector<float> nans(want.size(), std::numeric_limits<float>::quiet_NaN());
      MOESH_ASSERT_OK_AND_ASSIGN(auto dnan, Upload(nans));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      cp.x = dnan.get(), cp.overwrite = true;
      MOESH_ASSERT_OK(RunMoeCombine(cp));
      MOESH_ASSERT_OK(stream.Synchronize());
      MOESH_ASSERT_OK_AND_ASSIGN(auto stored, dnan.ToHost());
      EXPECT_LT(RelErr(stored, sum), 1e-4) << "combine with overwrite";
    }
  }
}

// EnqueueExpertMlp's two paths against plain C++: y[r] = down_e(silu(gate)
// * up) for every permuted row, with skewed loads (an empty expert, one of a
// few rows, one far over the rest) so the dense path's rounded GEMMs spill
// into their neighbours and must be overwritten.
TEST(ExpertMlpTest, GroupedAndDensePathsMatchReference) {
  MOESH_REQUIRE_GPU();
  const int tokens = 700, top_k = 4, experts = 8, h = 256, inter = 160;
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  const int pairs = tokens * top_k;
  ASSERT_GE(pairs, kDenseRowsPerExpert * experts);  // the dense path is taken
  // Expert 3 gets nothing; expert 5 only token 0's fourth pick; expert 0 the first pick of every
  // token.
  std::vector<int32_t> ids(pairs);
  for (int t = 0; t < tokens; ++t) {
    std::vector<int> pool = {1, 2, 4, 6, 7};
    std::shuffle(pool.begin(), pool.end(), rng);
    ids[t * top_k] = 0;
    for (int j = 1; j < top_k; ++j) ids[t * top_k + j] = pool[j - 1];
  }
  ids[3] = 5;
  std::vector<float> x = Randn(static_cast<size_t>(tokens) * h, rng);
  std::vector<float> gu = Randn(static_cast<size_t>(experts) * 2 * inter * h, rng, 0.06f);
  std::vector<float> dn = Randn(static_cast<size_t>(experts) * h * inter, rng, 0.08f);
  MOESH_ASSERT_OK_AND_ASSIGN(auto dids, Upload(ids));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dx, Upload(ToBf16Rounding(x)));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dgu, Upload(ToBf16Rounding(gu)));
  MOESH_ASSERT_OK_AND_ASSIGN(auto ddn, Upload(ToBf16Rounding(dn)));
  const size_t slack_rows = pairs + kDenseRowAlign;
  MOESH_ASSERT_OK_AND_ASSIGN(auto offsets, DeviceBuffer<int32_t>::Create(experts + 1));
  MOESH_ASSERT_OK_AND_ASSIGN(auto tiles, DeviceBuffer<int32_t>::Create(experts + 1));
  MOESH_ASSERT_OK_AND_ASSIGN(auto row_token, DeviceBuffer<int32_t>::Create(pairs));
  MOESH_ASSERT_OK_AND_ASSIGN(auto pair_row, DeviceBuffer<int32_t>::Create(pairs));
  MOESH_ASSERT_OK_AND_ASSIGN(auto gathered, DeviceBuffer<bf16>::Create(slack_rows * h));
  MOESH_ASSERT_OK_AND_ASSIGN(auto sgu, DeviceBuffer<bf16>::Create(slack_rows * 2 * inter));
  MOESH_ASSERT_OK_AND_ASSIGN(auto sact, DeviceBuffer<bf16>::Create(slack_rows * inter));
  MOESH_ASSERT_OK_AND_ASSIGN(auto y, DeviceBuffer<float>::Create(slack_rows * h));
  MOESH_ASSERT_OK_AND_ASSIGN(auto host_off, PinnedBuffer<int32_t>::Create(experts + 1));
  MOESH_ASSERT_OK_AND_ASSIGN(auto gemm, CublasGemm::Create());
  MOESH_ASSERT_OK_AND_ASSIGN(Stream stream, Stream::Create());
  for (auto* b : {&gathered, &sgu, &sact}) MOESH_ASSERT_OK(Poison(*b));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  MoePermuteParams pp;
  pp.topk_ids = dids.get(), pp.num_tokens = tokens, pp.top_k = top_k, pp.num_experts = experts,
  pp.tile_m = 64;
  pp.expert_offsets = offsets.get(), pp.tile_offsets = tiles.get(), pp.row_token = row_token.get();
  pp.pair_row = pair_row.get(), pp.stream = stream.get();
  MOESH_ASSERT_OK(RunMoePermute(pp));
  MOESH_ASSERT_OK(stream.Synchronize());
  MOESH_ASSERT_OK_AND_ASSIGN(auto h_off, offsets.ToHost());
  MOESH_ASSERT_OK_AND_ASSIGN(auto h_rt, row_token.ToHost());
  ASSERT_EQ(h_off[4] - h_off[3], 0);
  ASSERT_EQ(h_off[6] - h_off[5], 1);

  // Reference, from the bf16-rounded inputs (ToBf16Rounding rounded x, gu, dn in place).
  std::vector<float> ref(static_cast<size_t>(pairs) * h);
  std::vector<float> act(inter);
  for (int e = 0; e < experts; ++e) {
    for (int r = h_off[e]; r < h_off[e + 1]; ++r) {
      const float* xr = &x[static_cast<size_t>(h_rt[r]) * h];
      for (int j = 0; j < inter; ++j) {
        double g = 0, u = 0;
        for (int kk = 0; kk < h; ++kk) {
          g += static_cast<double>(xr[kk]) * gu[(static_cast<size_t>(e) * 2 * inter + j) * h + kk];
          u += static_cast<double>(xr[kk]) *
               gu[(static_cast<size_t>(e) * 2 * inter + inter + j) * h + kk];
        }
        const float gb = testing::RoundBf16(static_cast<float>(g)),
                    ub = testing::RoundBf16(static_cast<float>(u));
        act[j] = testing::RoundBf16(gb / (1.0f + std::exp(-gb)) * ub);
      }
      for (int j = 0; j < h; ++j) {
        double acc = 0;
        for (int kk = 0; kk < inter; ++kk)
          acc += static_cast<double>(act[kk]) * dn[(static_cast<size_t>(e) * h + j) * inter + kk];
        ref[static_cast<size_t>(r) * h + j] = static_cast<float>(acc);
      }
    }
  }
  for (bool dense : {false, true}) {
    SCOPED_TRACE(dense ? "dense per-expert GEMMs" : "grouped kernel");
    MOESH_ASSERT_OK(Poison(y));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ExpertMlpParams mp;
    mp.x = dx.get(), mp.ldx = h, mp.row_token = row_token.get(), mp.expert_offsets = offsets.get();
    mp.tile_offsets = tiles.get(), mp.tile_m = 64, mp.rows = pairs, mp.gate_up = dgu.get(),
    mp.down = ddn.get();
    mp.num_experts = experts, mp.hidden = h, mp.inter = inter;
    mp.gathered = dense ? gathered.get() : nullptr, mp.gu = sgu.get(), mp.act = sact.get(),
    mp.y = y.get();
    mp.host_offsets = host_off.get(), mp.gemm = gemm.get(), mp.stream = stream.get();
    MOESH_ASSERT_OK(EnqueueExpertMlp(mp));
    MOESH_ASSERT_OK(stream.Synchronize());
    MOESH_ASSERT_OK_AND_ASSIGN(auto got, y.ToHost());
    got.resize(ref.size());  // the slack rows are scratch
    EXPECT_LT(RelErr(got, ref), 1e-2);
  }
}

}  // namespace
}  // namespace moesh::cuda
