// The grouped GEMM on FP8 activations and FP8 weights (GroupedGemmParams::
// x_fp8, grouped_gemm_fp8.cu) and the expert MLP built on it
// (ExpertMlpParams::act_fp8), against plain C++ on the values the codes
// stand for: the permuted rows quantized on the GPU through row_token
// (RunQuantizeFp8's index and count) must be kernels/cpu/fp8.h's
// QuantizeFp8Rows bit for bit, zeros past the device-side row count; the
// GEMM must equal dequant(x) · dequant(w)^T up to the FP8 MMA's rounding.
// Rows get scales 2^-6..2^6 apart so a scale read from the wrong row or
// block shows.
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "base/dtype.h"
#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cuda/expert_mlp.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/random_topk.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::FreshSeed;
using testing::Poison;
using testing::Randn;
using testing::RelErr;
using testing::ScaleFp8Groups;
using testing::ToBf16Rounding;
using testing::ToFloats;
using testing::Upload;

// Each expert's [n, k] weights as a checkpoint stores them: codes and
// [Fp8Blocks(n), Fp8ScaleStride(k)] block scales per expert, and the values
// they stand for.
struct Fp8Experts {
  std::vector<uint8_t> codes;
  std::vector<float> scales, values;
};

Fp8Experts QuantizeExperts(const std::vector<float>& w, int experts, int n, int k) {
  const int stride = Fp8ScaleStride(k), nb = cpu::Fp8Blocks(n), kb = cpu::Fp8Blocks(k);
  Fp8Experts q;
  q.codes.resize(w.size());
  q.values.resize(w.size());
  q.scales.assign(static_cast<size_t>(experts) * nb * stride, 0.0f);
  std::vector<float> block(static_cast<size_t>(nb) * kb);
  for (int e = 0; e < experts; ++e) {
    const size_t at = static_cast<size_t>(e) * n * k;
    cpu::QuantizeFp8Blocks(&w[at], &q.codes[at], block.data(), n, k);
    for (int j = 0; j < nb; ++j) {
      for (int b = 0; b < kb; ++b)
        q.scales[(static_cast<size_t>(e) * nb + j) * stride + b] = block[j * kb + b];
    }
    for (int r = 0; r < n; ++r) {
      for (int c = 0; c < k; ++c) {
        const size_t i = at + static_cast<size_t>(r) * k + c;
        q.values[i] = F8E4M3ToF32(q.codes[i]) * block[(r / 128) * kb + c / 128];
      }
    }
  }
  return q;
}

// The permutation of `ids` (distinct experts per token) on the GPU.
struct Permuted {
  DeviceBuffer<int32_t> offsets, tiles, row_token, pair_row;
  std::vector<int32_t> h_off, h_rt;
};

void Permute(const std::vector<int32_t>& ids, int tokens, int top_k, int experts, int tile_m,
             int row_slack, cudaStream_t stream, Permuted* p) {
  const int pairs = tokens * top_k;
  MOESH_ASSERT_OK_AND_ASSIGN(auto dids, Upload(ids));
  MOESH_ASSERT_OK_AND_ASSIGN(p->offsets, DeviceBuffer<int32_t>::Create(experts + 1));
  MOESH_ASSERT_OK_AND_ASSIGN(p->tiles, DeviceBuffer<int32_t>::Create(experts + 1));
  // row_slack entries past the pairs stay poisoned (-1): nothing may read them.
  MOESH_ASSERT_OK_AND_ASSIGN(p->row_token, DeviceBuffer<int32_t>::Create(pairs + row_slack));
  MOESH_ASSERT_OK_AND_ASSIGN(p->pair_row, DeviceBuffer<int32_t>::Create(pairs));
  MOESH_ASSERT_OK(Poison(p->row_token));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  MoePermuteParams pp;
  pp.topk_ids = dids.get(), pp.num_tokens = tokens, pp.top_k = top_k, pp.num_experts = experts;
  pp.tile_m = tile_m, pp.expert_offsets = p->offsets.get(), pp.tile_offsets = p->tiles.get();
  pp.row_token = p->row_token.get(), pp.pair_row = p->pair_row.get(), pp.stream = stream;
  MOESH_ASSERT_OK(RunMoePermute(pp));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  MOESH_ASSERT_OK_AND_ASSIGN(p->h_off, p->offsets.ToHost());
  MOESH_ASSERT_OK_AND_ASSIGN(p->h_rt, p->row_token.ToHost());
}

// Rows `m` of x (bf16 values, `ld` floats a row) quantized on the GPU through
// `index` and a device count of `count`, checked against QuantizeFp8Rows of
// the rows they name: codes and scales bit for bit, zeros past `count`.
// Returns the values the codes stand for ([count, k]).
void QuantizeAndCheck(const DeviceBuffer<bf16>& dx, const std::vector<float>& x, int ld,
                      const Permuted& perm, int m, int count, int k, uint8_t* dq, float* ds,
                      cudaStream_t stream, std::vector<float>* values) {
  const int rows = Fp8Rows(m), kb = cpu::Fp8Blocks(k);
  QuantizeFp8Params qp;
  qp.x = dx.get(), qp.ldx = ld, qp.index = perm.row_token.get(), qp.count = perm.offsets.get();
  qp.count += static_cast<int>(perm.h_off.size()) - 1;  // offsets[E]: the real row count
  qp.q = dq, qp.scale = ds, qp.m = m, qp.k = k, qp.stream = stream;
  MOESH_ASSERT_OK(RunQuantizeFp8(qp));
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<uint8_t> got_q(static_cast<size_t>(rows) * k);
  std::vector<float> got_s(static_cast<size_t>(kb) * rows);
  ASSERT_EQ(cudaMemcpy(got_q.data(), dq, got_q.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_s.data(), ds, got_s.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> gathered(static_cast<size_t>(count) * k);
  for (int r = 0; r < count; ++r) {
    std::memcpy(&gathered[static_cast<size_t>(r) * k], &x[static_cast<size_t>(perm.h_rt[r]) * ld],
                k * sizeof(float));
  }
  std::vector<uint8_t> want_q(gathered.size());
  std::vector<float> want_s(static_cast<size_t>(count) * kb);
  cpu::QuantizeFp8Rows(gathered.data(), want_q.data(), want_s.data(), count, k);
  values->resize(gathered.size());
  for (int r = 0; r < rows; ++r) {
    for (int b = 0; b < kb; ++b) {
      const float s = got_s[static_cast<size_t>(b) * rows + r];
      if (r < count) {
        ASSERT_EQ(s, want_s[static_cast<size_t>(r) * kb + b])
            << "scale, row " << r << " block " << b;
      } else {
        ASSERT_EQ(s, 1e-10f / cpu::kFp8Max) << "scale past the count, row " << r;
      }
    }
    for (int c = 0; c < k; ++c) {
      const uint8_t q = got_q[static_cast<size_t>(r) * k + c];
      if (r < count) {
        ASSERT_EQ(q, want_q[static_cast<size_t>(r) * k + c]) << "code, row " << r << " col " << c;
        (*values)[static_cast<size_t>(r) * k + c] =
            F8E4M3ToF32(q) * want_s[static_cast<size_t>(r) * kb + c / 128];
      } else {
        ASSERT_EQ(q, 0) << "code past the count, row " << r;
      }
    }
  }
}

// The argument checks run before anything touches the device (no GPU
// needed): every refusal, and a well-formed call that launches nothing
// (max_tiles 0). The pointers are never dereferenced.
TEST(GroupedGemmFp8ArgsTest, RefusesWhatTheKernelsAreNotBuiltFor) {
  alignas(16) static uint8_t codes[64];
  alignas(16) static float scales[4];
  alignas(16) static int32_t offsets[4];
  GroupedGemmParams ok;
  ok.x_fp8 = codes, ok.ldx = 256, ok.x_scale = scales, ok.x_scale_ld = 8;
  ok.w_fp8 = codes, ok.w_scale = scales, ok.num_experts = 2, ok.n = 136, ok.k = 256;
  ok.expert_offsets = offsets, ok.tile_offsets = offsets, ok.tile_m = 16, ok.max_tiles = 0;
  ok.y = scales;
  EXPECT_TRUE(RunGroupedGemm(ok).ok()) << RunGroupedGemm(ok);
  ok.max_tiles = 3;  // from here on every call is refused before it launches
  auto refused = [&](const char* what, auto change) {
    GroupedGemmParams p = ok;
    change(p);
    EXPECT_EQ(RunGroupedGemm(p).code(), absl::StatusCode::kInvalidArgument) << what;
  };
  refused("k % 128", [](GroupedGemmParams& p) { p.k = 192, p.ldx = 192; });
  refused("ldx % 16", [](GroupedGemmParams& p) { p.ldx = 264; });
  refused("ldx < k", [](GroupedGemmParams& p) { p.ldx = 128; });
  refused("row_index", [&](GroupedGemmParams& p) { p.row_index = offsets; });
  refused("bf16 x beside",
          [](GroupedGemmParams& p) { p.x = reinterpret_cast<const bf16*>(codes); });
  refused("bf16 w beside",
          [](GroupedGemmParams& p) { p.w = reinterpret_cast<const bf16*>(codes); });
  refused("MXFP4 w beside", [](GroupedGemmParams& p) { p.w_fp4 = codes; });
  refused("no FP8 weights", [](GroupedGemmParams& p) { p.w_fp8 = nullptr; });
  refused("no x_scale", [](GroupedGemmParams& p) { p.x_scale = nullptr; });
  refused("no w_scale", [](GroupedGemmParams& p) { p.w_scale = nullptr; });
  refused("x_scale_ld", [](GroupedGemmParams& p) { p.x_scale_ld = 0; });
  refused("k_tile 64", [](GroupedGemmParams& p) { p.k_tile = 64; });
  refused("unaligned x_fp8", [](GroupedGemmParams& p) { p.x_fp8 = codes + 8; });
  refused("tile_m 128", [](GroupedGemmParams& p) { p.tile_m = 128; });
}

struct Fp8Case {
  int tokens, top_k, experts, used_experts, n, k, tile_m;
  OutType out;
};

TEST(GroupedGemmFp8Test, Fp8ActivationsMatchReference) {
  MOESH_REQUIRE_GPU();
  const Fp8Case cases[] = {
      {1, 6, 64, 64, 2816, 2048, 16, OutType::kBf16},       // V2-Lite gate_up, batch 1
      {256, 6, 64, 64, 2048, 1408, 32, OutType::kFloat32},  // V2-Lite down, batch 256
      {37, 6, 64, 20, 264, 256, 16, OutType::kFloat32},     // empty experts, n not 128's multiple
      {300, 4, 8, 5, 136, 384, 64, OutType::kBf16},         // prefill tiles (wgmma)
      {200, 6, 16, 16, 640, 1024, 64, OutType::kFloat32},   // more slices than the ring's stages
      {40, 6, 8, 8, 264, 768, 64, OutType::kFloat32},       // exactly the ring's six slices
      {128, 6, 8, 8, 264, 2048, 64, OutType::kBf16},        // three refills of the ring
      // More work items than SMs (the persistent CTAs take several each, the
      // ring running on across them): 512 items of 4 slices; then 29 of 32
      // experts used, n not 128's multiple, 3 slices an item.
      {1200, 6, 16, 16, 1024, 512, 64, OutType::kBf16},
      {1500, 8, 32, 29, 264, 384, 64, OutType::kFloat32},
      {3, 2, 8, 8, 64, 128, 16, OutType::kFloat32},  // golden sizes
  };
  MOESH_ASSERT_OK_AND_ASSIGN(Stream stream, Stream::Create());
  for (const Fp8Case& c : cases) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "tokens=" << c.tokens << " E=" << c.experts << " n=" << c.n << " k=" << c.k
                 << " tile_m=" << c.tile_m << " seed=" << seed);
    std::mt19937 rng(seed);
    const int pairs = c.tokens * c.top_k, slack = 5;  // a host bound past the real rows
    std::vector<float> x = Randn(static_cast<size_t>(c.tokens) * c.k, rng);
    ScaleFp8Groups(x.data(), c.tokens, c.k, c.k, rng);
    std::vector<float> w = Randn(static_cast<size_t>(c.experts) * c.n * c.k, rng, 0.05f);
    const Fp8Experts q = QuantizeExperts(w, c.experts, c.n, c.k);
    Permuted perm;
    ASSERT_NO_FATAL_FAILURE(Permute(UniformTopkIds(c.tokens, c.top_k, c.used_experts, rng),
                                    c.tokens, c.top_k, c.experts, c.tile_m, slack, stream.get(),
                                    &perm));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dx, Upload(ToBf16Rounding(x)));
    const int m = pairs + slack, rows = Fp8Rows(m);
    MOESH_ASSERT_OK_AND_ASSIGN(auto dq,
                               DeviceBuffer<uint8_t>::Create(static_cast<size_t>(rows) * c.k));
    MOESH_ASSERT_OK_AND_ASSIGN(
        auto ds, DeviceBuffer<float>::Create(static_cast<size_t>(rows) * cpu::Fp8Blocks(c.k)));
    MOESH_ASSERT_OK(Poison(dq));
    MOESH_ASSERT_OK(Poison(ds));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> xv;
    ASSERT_NO_FATAL_FAILURE(
        QuantizeAndCheck(dx, x, c.k, perm, m, pairs, c.k, dq.get(), ds.get(), stream.get(), &xv));

    MOESH_ASSERT_OK_AND_ASSIGN(auto dcodes, Upload(q.codes));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dscales, Upload(q.scales));
    const bool f32 = c.out == OutType::kFloat32;
    // Room for rows of n + 2 (y with a row stride past n).
    MOESH_ASSERT_OK_AND_ASSIGN(
        auto y, DeviceBuffer<uint8_t>::Create(static_cast<size_t>(m) * (c.n + 2) * (f32 ? 4 : 2)));
    MOESH_ASSERT_OK(Poison(y));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    GroupedGemmParams gp;
    gp.x_fp8 = dq.get(), gp.ldx = c.k, gp.x_scale = ds.get(), gp.x_scale_ld = rows;
    gp.w_fp8 = dcodes.get(), gp.w_scale = dscales.get();
    gp.num_experts = c.experts, gp.n = c.n, gp.k = c.k;
    gp.expert_offsets = perm.offsets.get(), gp.tile_offsets = perm.tiles.get();
    gp.tile_m = c.tile_m, gp.max_tiles = GroupedGemmMaxTiles(m, c.experts, c.tile_m);
    gp.y = y.get(), gp.out_type = c.out, gp.stream = stream.get();

    std::vector<int> expert_of_row(pairs);
    for (int e = 0; e < c.experts; ++e) {
      for (int r = perm.h_off[e]; r < perm.h_off[e + 1]; ++r) expert_of_row[r] = e;
    }
    std::vector<float> ref(static_cast<size_t>(pairs) * c.n);
    for (int r = 0; r < pairs; ++r) {
      const float* xr = &xv[static_cast<size_t>(r) * c.k];
      const float* we = &q.values[static_cast<size_t>(expert_of_row[r]) * c.n * c.k];
      for (int j = 0; j < c.n; ++j) {
        double acc = 0.0;
        for (int kk = 0; kk < c.k; ++kk)
          acc += static_cast<double>(xr[kk]) * we[static_cast<size_t>(j) * c.k + kk];
        ref[static_cast<size_t>(r) * c.n + j] = static_cast<float>(acc);
      }
    }
    // 64-row tiles: the wgmma kernel into rows of n, then of n + 2 (the
    // columns past n untouched), then the mma.sync one.
    struct Variant {
      bool mma_sync;
      int ldy;
      const char* name;
    };
    std::vector<Variant> variants = {{false, c.n, c.tile_m == 64 ? "wgmma" : "mma.sync"}};
    if (c.tile_m == 64) {
      variants.push_back({false, c.n + 2, "wgmma, ldy n + 2"});
      variants.push_back({true, c.n, "mma.sync"});
    }
    for (const Variant& v : variants) {
      SCOPED_TRACE(v.name);
      MOESH_ASSERT_OK(Poison(y));
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      gp.x_fp8_mma_sync = v.mma_sync;
      gp.ldy = v.ldy;
      MOESH_ASSERT_OK(RunGroupedGemm(gp));
      MOESH_ASSERT_OK(stream.Synchronize());
      MOESH_ASSERT_OK_AND_ASSIGN(auto raw, y.ToHost());
      const size_t elem = f32 ? 4 : 2;
      std::vector<float> got(ref.size());
      for (int r = 0; r < pairs; ++r) {
        const uint8_t* row = raw.data() + static_cast<size_t>(r) * v.ldy * elem;
        for (int j = 0; j < c.n; ++j) {
          float value;
          if (f32) {
            std::memcpy(&value, row + j * 4, 4);
          } else {
            bf16 b;
            std::memcpy(&b, row + j * 2, 2);
            value = ToFloats(std::vector<bf16>{b})[0];
          }
          got[static_cast<size_t>(r) * c.n + j] = value;
        }
        // A row's columns past n are not written.
        for (size_t i = c.n * elem; i < v.ldy * elem; ++i)
          ASSERT_EQ(row[i], 0xff) << "row " << r << " byte " << i << " past n written";
      }
      // Hopper's FP8 MMA sums a block's products at about 13 mantissa bits
      // (Fp8Test.GemvMatchesTheCpu's bound); bf16 out adds its rounding.
      EXPECT_LT(RelErr(got, ref), f32 ? 2e-3 : 6e-3);
      // Row by row too: the rows' scales are 2^12 apart, so a row-local error
      // (a wrong scale row, a missed row) could hide in the global ratio.
      for (int r = 0; r < pairs; ++r) {
        const size_t at = static_cast<size_t>(r) * c.n;
        const std::vector<float> g(got.begin() + at, got.begin() + at + c.n),
            want(ref.begin() + at, ref.begin() + at + c.n);
        ASSERT_LT(RelErr(g, want), f32 ? 1e-2 : 2e-2) << "row " << r;
      }
      // The rows past the real count are not written.
      for (size_t i = static_cast<size_t>(pairs) * v.ldy * elem; i < raw.size(); ++i)
        ASSERT_EQ(raw[i], 0xff) << "byte " << i << " past the permuted rows written";
    }
    gp.ldy = 0;
    gp.x_fp8_mma_sync = false;

    GroupedGemmParams bad = gp;
    bad.row_index = perm.row_token.get();
    EXPECT_EQ(RunGroupedGemm(bad).code(), absl::StatusCode::kInvalidArgument) << "row_index";
    bad = gp, bad.x = dx.get();
    EXPECT_EQ(RunGroupedGemm(bad).code(), absl::StatusCode::kInvalidArgument) << "x and x_fp8";
    bad = gp, bad.w_fp8 = nullptr, bad.w = reinterpret_cast<const bf16*>(dcodes.get());
    EXPECT_EQ(RunGroupedGemm(bad).code(), absl::StatusCode::kInvalidArgument) << "bf16 weights";
    bad = gp, bad.k = c.k - 64, bad.ldx = c.k;
    EXPECT_EQ(RunGroupedGemm(bad).code(), absl::StatusCode::kInvalidArgument) << "k % 128";
  }
}

// EnqueueExpertMlp with FP8 weights and FP8 activations against plain C++:
// the permuted rows quantized (checked bit for bit above), gate and up from
// the codes' values rounded to bf16, SiLU·mul rounded to bf16, quantized per
// row and 128 columns (QuantizeFp8Rows), then down.
void ExpertMlpCase(int tile_m);

TEST(GroupedGemmFp8Test, ExpertMlpOnFp8ActivationsMatchesReference) {
  MOESH_REQUIRE_GPU();
  for (int tile_m : {16, 64}) {
    SCOPED_TRACE(::testing::Message() << "tile_m=" << tile_m);
    ASSERT_NO_FATAL_FAILURE(ExpertMlpCase(tile_m));
  }
}

void ExpertMlpCase(int tile_m) {
  const int tokens = 40, top_k = 4, experts = 8, h = 256, inter = 384;
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  // A host bound past the real rows: the gate/up rows there are poison
  // (NaN) and the second quantization must not read them.
  const int pairs = tokens * top_k, slack = 6, bound = pairs + slack, rows = Fp8Rows(bound);
  std::vector<float> x = Randn(static_cast<size_t>(tokens) * h, rng);  // bf16-rounded below
  const Fp8Experts gu = QuantizeExperts(
      Randn(static_cast<size_t>(experts) * 2 * inter * h, rng, 0.06f), experts, 2 * inter, h);
  const Fp8Experts dn = QuantizeExperts(Randn(static_cast<size_t>(experts) * h * inter, rng, 0.08f),
                                        experts, h, inter);
  MOESH_ASSERT_OK_AND_ASSIGN(Stream stream, Stream::Create());
  Permuted perm;
  ASSERT_NO_FATAL_FAILURE(Permute(UniformTopkIds(tokens, top_k, experts, rng), tokens, top_k,
                                  experts, tile_m, slack, stream.get(), &perm));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dx, Upload(ToBf16Rounding(x)));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dgu, Upload(gu.codes));
  MOESH_ASSERT_OK_AND_ASSIGN(auto dgus, Upload(gu.scales));
  MOESH_ASSERT_OK_AND_ASSIGN(auto ddn, Upload(dn.codes));
  MOESH_ASSERT_OK_AND_ASSIGN(auto ddns, Upload(dn.scales));
  MOESH_ASSERT_OK_AND_ASSIGN(auto sgu,
                             DeviceBuffer<bf16>::Create(static_cast<size_t>(bound) * 2 * inter));
  MOESH_ASSERT_OK_AND_ASSIGN(auto sact,
                             DeviceBuffer<bf16>::Create(static_cast<size_t>(bound) * inter));
  MOESH_ASSERT_OK_AND_ASSIGN(auto y, DeviceBuffer<float>::Create(static_cast<size_t>(bound) * h));
  MOESH_ASSERT_OK_AND_ASSIGN(auto aq,
                             DeviceBuffer<uint8_t>::Create(static_cast<size_t>(rows) * inter));
  MOESH_ASSERT_OK_AND_ASSIGN(
      auto as, DeviceBuffer<float>::Create(static_cast<size_t>(rows) * cpu::Fp8Blocks(inter)));
  for (auto* b : {&sgu, &sact}) MOESH_ASSERT_OK(Poison(*b));
  MOESH_ASSERT_OK(Poison(y));
  MOESH_ASSERT_OK(Poison(aq));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ExpertMlpParams mp;
  mp.x = dx.get(), mp.ldx = h, mp.row_token = perm.row_token.get();
  mp.expert_offsets = perm.offsets.get(), mp.tile_offsets = perm.tiles.get(), mp.tile_m = tile_m;
  mp.rows = bound;
  mp.gate_up_fp8 = dgu.get(), mp.gate_up_scale = dgus.get(), mp.down_fp8 = ddn.get();
  mp.down_scale = ddns.get(), mp.num_experts = experts, mp.hidden = h, mp.inter = inter;
  mp.gu = sgu.get(), mp.act = sact.get(), mp.y = y.get();
  mp.act_fp8 = aq.get(), mp.act_fp8_scale = as.get(), mp.stream = stream.get();
  MOESH_ASSERT_OK(EnqueueExpertMlp(mp));
  MOESH_ASSERT_OK(stream.Synchronize());
  MOESH_ASSERT_OK_AND_ASSIGN(auto got, y.ToHost());
  got.resize(static_cast<size_t>(pairs) * h);  // the slack rows are scratch

  std::vector<float> ref(static_cast<size_t>(pairs) * h), act(inter), xr(h);
  std::vector<uint8_t> codes(std::max(h, inter));
  std::vector<float> scales(cpu::Fp8Blocks(std::max(h, inter)));
  for (int e = 0; e < experts; ++e) {
    for (int r = perm.h_off[e]; r < perm.h_off[e + 1]; ++r) {
      cpu::QuantizeFp8Rows(&x[static_cast<size_t>(perm.h_rt[r]) * h], codes.data(), scales.data(),
                           1, h);
      for (int c = 0; c < h; ++c) xr[c] = F8E4M3ToF32(codes[c]) * scales[c / 128];
      for (int j = 0; j < inter; ++j) {
        double g = 0, u = 0;
        for (int kk = 0; kk < h; ++kk) {
          g += static_cast<double>(xr[kk]) *
               gu.values[(static_cast<size_t>(e) * 2 * inter + j) * h + kk];
          u += static_cast<double>(xr[kk]) *
               gu.values[(static_cast<size_t>(e) * 2 * inter + inter + j) * h + kk];
        }
        const float gb = testing::RoundBf16(static_cast<float>(g)),
                    ub = testing::RoundBf16(static_cast<float>(u));
        act[j] = testing::RoundBf16(gb / (1.0f + std::exp(-gb)) * ub);
      }
      cpu::QuantizeFp8Rows(act.data(), codes.data(), scales.data(), 1, inter);
      for (int c = 0; c < inter; ++c) act[c] = F8E4M3ToF32(codes[c]) * scales[c / 128];
      for (int j = 0; j < h; ++j) {
        double acc = 0;
        for (int kk = 0; kk < inter; ++kk)
          acc += static_cast<double>(act[kk]) *
                 dn.values[(static_cast<size_t>(e) * h + j) * inter + kk];
        ref[static_cast<size_t>(r) * h + j] = static_cast<float>(acc);
      }
    }
  }
  // An activation on either side of an e4m3 rounding boundary moves its code
  // by one step (1/16 relative), so the bound is the FP8 scheme's, not the MMA's.
  EXPECT_LT(RelErr(got, ref), 2e-2);

  ExpertMlpParams bad = mp;
  bad.act_fp8_scale = nullptr;
  EXPECT_EQ(EnqueueExpertMlp(bad).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moesh::cuda
