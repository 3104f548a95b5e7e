// The MoE permutation, grouped GEMM and combine against plain C++ on fresh
// random inputs: ragged expert loads (empty experts included), gathered and
// contiguous rows, every tile height, bf16 and fp32 outputs.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>

#include "gtest/gtest.h"
#include "kernels/cuda/model/model_ops.h"
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
      {1, 6, 64, 64, 2816, 2048, 16, true, OutType::kBf16},       // V2-Lite decode, batch 1
      {37, 6, 64, 20, 264, 256, 16, true, OutType::kFloat32},     // empty experts, n not a tile multiple
      {256, 6, 64, 64, 512, 1408, 32, false, OutType::kFloat32},  // V2-Lite down at batch 256 (k = 1408)
      {128, 6, 64, 64, 2816, 2048, 16, true, OutType::kBf16},     // V2-Lite gate_up at batch 128
      {300, 4, 8, 5, 136, 96, 64, true, OutType::kBf16},          // prefill tiles, 32-wide k slices
      {300, 4, 8, 5, 136, 128, 64, true, OutType::kFloat32},      // prefill tiles, 64-wide k slices
      {100, 6, 16, 16, 264, 512, 32, true, OutType::kFloat32, 32},  // 32-wide slices forced
      {50, 6, 16, 16, 264, 512, 16, true, OutType::kBf16, 32},
      {3, 2, 8, 8, 64, 32, 16, true, OutType::kFloat32},          // golden sizes
  };
  Stream stream;
  MOESH_ASSERT_OK_AND_ASSIGN(stream, Stream::Create());
  for (const Case& c : cases) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << "tokens=" << c.tokens << " E=" << c.experts << " n=" << c.n << " k=" << c.k
                                      << " tile_m=" << c.tile_m << " k_tile=" << c.k_tile << " seed=" << seed);
    std::mt19937 rng(seed);
    const int pairs = c.tokens * c.top_k;
    // Distinct experts per token, drawn from the first used_experts.
    std::vector<int32_t> ids(pairs);
    std::vector<int> pool(c.used_experts);
    for (int t = 0; t < c.tokens; ++t) {
      std::iota(pool.begin(), pool.end(), 0);
      std::shuffle(pool.begin(), pool.end(), rng);
      for (int j = 0; j < c.top_k; ++j) ids[t * c.top_k + j] = pool[j];
    }
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
    pp.topk_ids = dids.get(), pp.num_tokens = c.tokens, pp.top_k = c.top_k, pp.num_experts = c.experts;
    pp.tile_m = c.tile_m, pp.expert_offsets = offsets.get(), pp.tile_offsets = tiles.get();
    pp.row_token = row_token.get(), pp.pair_row = pair_row.get(), pp.expert_counts = counts.get();
    pp.stream = stream.get();
    MOESH_ASSERT_OK(RunMoePermute(pp));

    const bool f32 = c.out == OutType::kFloat32;
    MOESH_ASSERT_OK_AND_ASSIGN(auto y, DeviceBuffer<uint8_t>::Create(static_cast<size_t>(pairs) * c.n * (f32 ? 4 : 2)));
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
        for (int kk = 0; kk < c.k; ++kk) acc += static_cast<double>(xr[kk]) * we[static_cast<size_t>(j) * c.k + kk];
        ref[static_cast<size_t>(r) * c.n + j] = static_cast<float>(acc);
      }
    }
    std::vector<float> got;
    if (f32) {
      std::vector<uint8_t> raw;
      MOESH_ASSERT_OK_AND_ASSIGN(raw, y.ToHost());
      got.resize(ref.size());
      std::memcpy(got.data(), raw.data(), got.size() * 4);
    } else {
      MOESH_ASSERT_OK_AND_ASSIGN(auto raw, y.ToHost());
      std::vector<bf16> b(ref.size());
      std::memcpy(b.data(), raw.data(), b.size() * 2);
      got = ToFloats(b);
    }
    const double err = RelErr(got, ref);
    EXPECT_LT(err, f32 ? 2e-3 : 6e-3) << "grouped GEMM";

    // The combine: x2[t] += sum_k wt[t, k] * y[pair_row[t, k]] (fp32 rows).
    if (f32) {
      std::vector<float> wt = Randn(pairs, rng, 0.3f), base = Randn(static_cast<size_t>(c.tokens) * c.n, rng);
      std::vector<float> want = base;
      for (int t = 0; t < c.tokens; ++t) {
        for (int kk = 0; kk < c.top_k; ++kk) {
          const int r = h_pr[t * c.top_k + kk];
          for (int j = 0; j < c.n; ++j) {
            want[static_cast<size_t>(t) * c.n + j] += wt[t * c.top_k + kk] * got[static_cast<size_t>(r) * c.n + j];
          }
        }
      }
      MOESH_ASSERT_OK_AND_ASSIGN(auto dwt, Upload(wt));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dbase, Upload(base));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      MoeCombineParams cp;
      cp.expert_out = reinterpret_cast<const float*>(y.get()), cp.pair_row = pair_row.get(), cp.topk_weights = dwt.get();
      cp.num_tokens = c.tokens, cp.top_k = c.top_k, cp.hidden = c.n, cp.x = dbase.get(), cp.stream = stream.get();
      MOESH_ASSERT_OK(RunMoeCombine(cp));
      MOESH_ASSERT_OK(stream.Synchronize());
      MOESH_ASSERT_OK_AND_ASSIGN(auto combined, dbase.ToHost());
      EXPECT_LT(RelErr(combined, want), 1e-5) << "combine";
    }
  }
}

}  // namespace
}  // namespace moesh::cuda
