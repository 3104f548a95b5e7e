// GEMM, RMSNorm, RoPE (+ paged cache write) and SiLU-and-mul against
// kernels/cpu on the same bf16-rounded inputs.
#include "kernels/cpu/ops.h"

#include <cmath>

#include "gtest/gtest.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::FreshSeed;
using testing::Poison;
using testing::Randn;
using testing::RelErr;
using testing::RoundBf16;
using testing::ToBf16Rounding;
using testing::ToFloats;
using testing::Upload;

struct GemmCase {
  int m, n, k, ldx, ldy;
  OutType out;
  bool accumulate;
};

TEST(GemmTest, MatchesCpuLinear) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(auto gemm, CublasGemm::Create());
  const GemmCase cases[] = {
      {1, 576, 2048, 0, 0, OutType::kBf16, false},
      {7, 3072, 2048, 0, 0, OutType::kBf16, false},
      {33, 64, 2048, 0, 0, OutType::kFloat32, false},  // router: fp32 out
      {128, 2048, 1408, 1416, 2056, OutType::kBf16, false},
      {5, 200, 512, 520, 0, OutType::kFloat32, true},
  };
  for (const GemmCase& c : cases) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "m=" << c.m << " n=" << c.n << " k=" << c.k << " seed=" << seed);
    std::mt19937 rng(seed);
    const int ldx = c.ldx ? c.ldx : c.k, ldy = c.ldy ? c.ldy : c.n;
    std::vector<float> x = Randn(static_cast<size_t>(c.m) * ldx, rng),
                       w = Randn(static_cast<size_t>(c.n) * c.k, rng, 0.05f);
    std::vector<float> y0 = Randn(static_cast<size_t>(c.m) * ldy, rng);
    MOESH_ASSERT_OK_AND_ASSIGN(auto dx, Upload(ToBf16Rounding(x)));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dw, Upload(ToBf16Rounding(w)));
    std::vector<float> ref;
    std::vector<float> out;
    GemmParams p;
    p.x = dx.get();
    p.w = dw.get();
    p.m = c.m, p.n = c.n, p.k = c.k, p.ldx = c.ldx, p.ldy = c.ldy;
    p.out_type = c.out;
    p.accumulate = c.accumulate;
    if (c.out == OutType::kFloat32) {
      MOESH_ASSERT_OK_AND_ASSIGN(auto dy, DeviceBuffer<float>::Create(y0.size()));
      if (c.accumulate) {
        MOESH_ASSERT_OK(dy.CopyFrom(y0));
      } else {
        MOESH_ASSERT_OK(Poison(dy));
      }
      p.y = dy.get();
      MOESH_ASSERT_OK(gemm->Run(p));
      MOESH_ASSERT_OK_AND_ASSIGN(out, dy.ToHost());
    } else {
      MOESH_ASSERT_OK_AND_ASSIGN(auto dy, DeviceBuffer<bf16>::Create(y0.size()));
      MOESH_ASSERT_OK(Poison(dy));
      p.y = dy.get();
      MOESH_ASSERT_OK(gemm->Run(p));
      MOESH_ASSERT_OK_AND_ASSIGN(auto yb, dy.ToHost());
      out = ToFloats(yb);
    }
    ref = c.accumulate ? y0 : std::vector<float>(y0.size(), 0.0f);
    cpu::Linear(x.data(), w.data(), ref.data(), c.m, c.n, c.k, c.accumulate, ldx, ldy);
    // Compare only the [m, n] block; padding columns stay poisoned.
    std::vector<float> o2, r2;
    for (int i = 0; i < c.m; ++i) {
      for (int j = 0; j < c.n; ++j) {
        o2.push_back(out[static_cast<size_t>(i) * ldy + j]);
        r2.push_back(ref[static_cast<size_t>(i) * ldy + j]);
      }
    }
    EXPECT_LE(RelErr(o2, r2), c.out == OutType::kBf16 ? 1e-2 : 1e-5);
  }
}

// Per-head GEMMs as MLA's expansion runs them: one x for every head
// (stride_x 0), weights stored [n, k] or [k, n] (w_kn), outputs interleaved
// by head in one row (ldy = heads · n).
TEST(GemmTest, BatchedSharedInputBothWeightLayouts) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(auto gemm, CublasGemm::Create());
  const int heads = 3, m = 70, n = 128, k = 512, ldx = 576;
  for (const bool w_kn : {false, true}) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << "w_kn=" << w_kn << " seed=" << seed);
    std::mt19937 rng(seed);
    std::vector<float> x = Randn(static_cast<size_t>(m) * ldx, rng),
                       w = Randn(static_cast<size_t>(heads) * n * k, rng, 0.05f);
    MOESH_ASSERT_OK_AND_ASSIGN(auto dx, Upload(ToBf16Rounding(x)));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dw, Upload(ToBf16Rounding(w)));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dy, DeviceBuffer<float>::Create(size_t{m} * heads * n));
    MOESH_ASSERT_OK(Poison(dy));
    BatchedGemmParams p;
    p.x = dx.get(), p.ldx = ldx, p.stride_x = 0;
    p.w = dw.get(), p.ldw = w_kn ? n : k, p.stride_w = static_cast<int64_t>(n) * k, p.w_kn = w_kn;
    p.y = dy.get(), p.ldy = heads * n, p.stride_y = n, p.out_type = OutType::kFloat32;
    p.batch = heads, p.m = m, p.n = n, p.k = k;
    MOESH_ASSERT_OK(gemm->RunBatched(p));
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> out, dy.ToHost());
    std::vector<float> ref(out.size());
    for (int h = 0; h < heads; ++h) {
      const float* wh = &w[static_cast<size_t>(h) * n * k];
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double acc = 0.0;
          for (int t = 0; t < k; ++t) {
            const float wv =
                w_kn ? wh[static_cast<size_t>(t) * n + j] : wh[static_cast<size_t>(j) * k + t];
            acc += static_cast<double>(x[static_cast<size_t>(i) * ldx + t]) * wv;
          }
          ref[(static_cast<size_t>(i) * heads + h) * n + j] = static_cast<float>(acc);
        }
      }
    }
    EXPECT_LE(RelErr(out, ref), 1e-5);
  }
}

// RunF32 at decode sizes (our one-launch GEMV: up to 8 rows, from 32
// columns) and past them (cuBLAS), against a double-precision reference: the
// routers' and V4's mHC mix shapes, accumulate, an odd n; and the same bits
// run to run.
TEST(GemmTest, F32MatchesADoubleReference) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(auto gemm, CublasGemm::Create());
  struct Case {
    int m, n, k;
    bool accumulate;
  };
  const Case cases[] = {{1, 64, 2048, false}, {3, 256, 7168, false}, {8, 33, 16384, true},
                        {8, 24, 16384, true}, {1, 4, 16384, false},  {2, 7, 12, true},
                        {9, 64, 2048, false}, {2, 7, 10, true}};  // k not a multiple of 4: cuBLAS
  for (const Case& c : cases) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "m=" << c.m << " n=" << c.n << " k=" << c.k << " seed=" << seed);
    std::mt19937 rng(seed);
    const std::vector<float> x = Randn(static_cast<size_t>(c.m) * c.k, rng);
    const std::vector<float> w = Randn(static_cast<size_t>(c.n) * c.k, rng, 0.05f);
    const std::vector<float> y0 = Randn(static_cast<size_t>(c.m) * c.n, rng);
    std::vector<float> ref(y0.size());
    for (int t = 0; t < c.m; ++t) {
      for (int j = 0; j < c.n; ++j) {
        double acc = c.accumulate ? y0[static_cast<size_t>(t) * c.n + j] : 0.0;
        for (int i = 0; i < c.k; ++i)
          acc += static_cast<double>(x[static_cast<size_t>(t) * c.k + i]) *
                 w[static_cast<size_t>(j) * c.k + i];
        ref[static_cast<size_t>(t) * c.n + j] = static_cast<float>(acc);
      }
    }
    MOESH_ASSERT_OK_AND_ASSIGN(auto dx, Upload(x));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dw, Upload(w));
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      MOESH_ASSERT_OK_AND_ASSIGN(auto dy, Upload(y0));
      MOESH_ASSERT_OK(
          gemm->RunF32(dx.get(), dw.get(), dy.get(), c.m, c.n, c.k, c.accumulate, nullptr));
      MOESH_ASSERT_OK_AND_ASSIGN(const std::vector<float> got, dy.ToHost());
      // fp32 sums of up to 16384 products in another order than the
      // double reference: ~1e-6 relative; a wrong row or column is ~1.
      EXPECT_LE(RelErr(got, ref), 1e-4);
      if (run == 0) {
        first = got;
      } else {
        EXPECT_EQ(got, first) << "not deterministic";
      }
    }
  }
}

TEST(RmsNormTest, PlainAndFusedAddMatchCpu) {
  MOESH_REQUIRE_GPU();
  struct Case {
    int rows, n, ldx, ldy;
  };
  for (const Case c : {Case{37, 2048, 0, 0}, Case{5, 512, 576, 0}, Case{9, 100, 104, 101},
                       Case{3, 7168, 0, 7176}}) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << "rows=" << c.rows << " n=" << c.n << " seed=" << seed);
    std::mt19937 rng(seed);
    const int ldx = c.ldx ? c.ldx : c.n, ldy = c.ldy ? c.ldy : c.n;
    std::vector<float> x = Randn(static_cast<size_t>(c.rows) * ldx, rng, 2.0f);
    std::vector<float> r = Randn(static_cast<size_t>(c.rows) * c.n, rng);
    std::vector<float> w = Randn(c.n, rng, 0.2f, 1.0f);
    std::vector<bf16> xb = ToBf16Rounding(x);
    MOESH_ASSERT_OK_AND_ASSIGN(auto dx, Upload(xb));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dr, Upload(ToBf16Rounding(r)));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dw, Upload(ToBf16Rounding(w)));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dy,
                               DeviceBuffer<bf16>::Create(static_cast<size_t>(c.rows) * ldy));

    // Plain.
    MOESH_ASSERT_OK(Poison(dy));
    RmsNormParams p;
    p.x = dx.get(), p.weight = dw.get(), p.y = dy.get();
    p.rows = c.rows, p.n = c.n, p.ldx = c.ldx, p.ldy = c.ldy, p.eps = 1e-6f;
    MOESH_ASSERT_OK(RunRmsNorm(p));
    MOESH_ASSERT_OK_AND_ASSIGN(auto yb, dy.ToHost());
    std::vector<float> ref(static_cast<size_t>(c.rows) * c.n), out(ref.size());
    cpu::RmsNorm(x.data(), w.data(), ref.data(), c.rows, c.n, 1e-6f, ldx, c.n);
    for (int i = 0; i < c.rows; ++i)
      for (int j = 0; j < c.n; ++j)
        out[static_cast<size_t>(i) * c.n + j] =
            testing::ToFloat(yb[static_cast<size_t>(i) * ldy + j]);
    EXPECT_LE(RelErr(out, ref), 1e-2);

    // Fused: x += residual (bf16), y = norm(x).
    MOESH_ASSERT_OK(Poison(dy));
    AddRmsNormParams a;
    a.x = dx.get(), a.residual = dr.get(), a.weight = dw.get(), a.y = dy.get();
    a.rows = c.rows, a.n = c.n, a.ldx = c.ldx, a.ldy = c.ldy, a.eps = 1e-6f;
    MOESH_ASSERT_OK(RunAddRmsNorm(a));
    MOESH_ASSERT_OK_AND_ASSIGN(auto xs, dx.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(yb, dy.ToHost());
    std::vector<float> sum = x, xs_out, xs_ref;
    for (int i = 0; i < c.rows; ++i) {
      for (int j = 0; j < c.n; ++j) {
        float& s = sum[static_cast<size_t>(i) * ldx + j];
        s = RoundBf16(s + r[static_cast<size_t>(i) * c.n + j]);
        xs_ref.push_back(s);
        xs_out.push_back(testing::ToFloat(xs[static_cast<size_t>(i) * ldx + j]));
        out[static_cast<size_t>(i) * c.n + j] =
            testing::ToFloat(yb[static_cast<size_t>(i) * ldy + j]);
      }
    }
    EXPECT_LE(RelErr(xs_out, xs_ref), 1e-6);  // the same bf16 rounding of the same sum
    cpu::RmsNorm(sum.data(), w.data(), ref.data(), c.rows, c.n, 1e-6f, ldx, c.n);
    EXPECT_LE(RelErr(out, ref), 1e-2);
  }
}

cpu::RopeTable V2LiteYarn(int dim) {
  cpu::YarnParams y;
  y.theta = 10000;
  y.factor = 40;
  y.original_max_position_embeddings = 4096;
  y.mscale = 0.707;
  y.mscale_all_dim = 0.707;
  return cpu::YarnRopeTable(y, dim);
}

TEST(RopeTest, InPlaceMatchesCpuBothLayouts) {
  MOESH_REQUIRE_GPU();
  const int tokens = 19, heads = 16, head_stride = 192, offset = 128, dim = 64;
  for (cpu::RopeLayout layout : {cpu::RopeLayout::kInterleaved, cpu::RopeLayout::kHalves}) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << "layout=" << static_cast<int>(layout) << " seed=" << seed);
    std::mt19937 rng(seed);
    cpu::RopeTable table = V2LiteYarn(dim);
    table.attention_factor = 1.1f;  // exercise the factor
    std::vector<float> x = Randn(static_cast<size_t>(tokens) * heads * head_stride, rng);
    MOESH_ASSERT_OK_AND_ASSIGN(auto dx, Upload(ToBf16Rounding(x)));
    std::vector<int32_t> pos(tokens);
    std::uniform_int_distribution<int> pd(0, 163839);
    for (int& v : pos) v = pd(rng);
    MOESH_ASSERT_OK_AND_ASSIGN(auto dpos, Upload(pos));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dfreq, Upload(table.inv_freq));
    RopeParams p;
    p.x = dx.get(), p.num_tokens = tokens, p.num_rows = heads;
    p.token_stride = heads * head_stride, p.row_stride = head_stride, p.offset = offset;
    p.positions = dpos.get();
    p.rope = {dfreq.get(), table.attention_factor, dim, layout};
    MOESH_ASSERT_OK(RunRope(p));
    MOESH_ASSERT_OK_AND_ASSIGN(auto xb, dx.ToHost());
    std::vector<float> ref = x;
    for (int t = 0; t < tokens; ++t) {
      cpu::RopeParams c;
      c.x = ref.data() + static_cast<size_t>(t) * heads * head_stride;
      c.num_rows = heads, c.row_stride = head_stride, c.offset = offset, c.dim = dim;
      c.position = pos[t], c.layout = layout, c.table = &table;
      cpu::RunRope(c);
    }
    EXPECT_LE(RelErr(ToFloats(xb), ref), 1e-2);
  }
}

TEST(RopeTest, KvCacheWriteMatchesCpu) {
  MOESH_REQUIRE_GPU();
  const int rank = 512, dim = 64, row = rank + dim, kv_ld = 576, num_blocks = 9, tokens = 70;
  const int q_heads = 16, q_stride = 192;
  for (bool with_norm : {true, false}) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << "with_norm=" << with_norm << " seed=" << seed);
    std::mt19937 rng(seed);
    cpu::RopeTable table = V2LiteYarn(dim);
    std::vector<float> kv = Randn(static_cast<size_t>(tokens) * kv_ld, rng, 3.0f);
    std::vector<float> w = Randn(rank, rng, 0.1f, 1.0f);
    std::vector<float> q = Randn(static_cast<size_t>(tokens) * q_heads * q_stride, rng);
    // Scattered slots: a random permutation of the cache's slots; every 7th token is padding.
    std::vector<int32_t> slots(num_blocks * kKvBlockSize), pos(tokens), slot_map(tokens);
    for (size_t i = 0; i < slots.size(); ++i) slots[i] = static_cast<int32_t>(i);
    std::shuffle(slots.begin(), slots.end(), rng);
    for (int t = 0; t < tokens; ++t) {
      slot_map[t] = t % 7 == 3 ? -1 : slots[t];
      pos[t] = 1000 + 13 * t;
    }
    MOESH_ASSERT_OK_AND_ASSIGN(auto dkv, Upload(ToBf16Rounding(kv)));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dw, Upload(ToBf16Rounding(w)));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dq, Upload(ToBf16Rounding(q)));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dslot, Upload(slot_map));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dpos, Upload(pos));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dfreq, Upload(table.inv_freq));
    MOESH_ASSERT_OK_AND_ASSIGN(
        auto dcache,
        DeviceBuffer<bf16>::Create(static_cast<size_t>(num_blocks) * kKvBlockSize * row));
    MOESH_ASSERT_OK(Poison(dcache));
    RopeKvCacheParams p;
    p.kv = dkv.get(), p.kv_ld = kv_ld, p.kv_norm_weight = with_norm ? dw.get() : nullptr,
    p.eps = 1e-6f;
    p.cache = dcache.get(), p.num_blocks = num_blocks, p.slot_mapping = dslot.get();
    p.num_tokens = tokens, p.kv_lora_rank = rank;
    p.q = dq.get(), p.q_num_heads = q_heads, p.q_token_stride = q_heads * q_stride,
    p.q_head_stride = q_stride;
    p.q_rope_offset = 128;
    p.positions = dpos.get();
    p.rope = {dfreq.get(), table.attention_factor, dim, cpu::RopeLayout::kInterleaved};
    // The same queries roped from a copy into another layout's slices (q_src:
    // the absorbed query's rope part, read from the projection's rows).
    const int out_stride = 80, out_offset = 8;
    MOESH_ASSERT_OK_AND_ASSIGN(auto dq_src, Upload(ToBf16Rounding(q)));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dq_out, DeviceBuffer<bf16>::Create(static_cast<size_t>(tokens) *
                                                                       q_heads * out_stride));
    MOESH_ASSERT_OK(Poison(dq_out));
    MOESH_ASSERT_OK(RunRopeKvCacheWrite(p));
    RopeKvCacheParams from = p;
    from.q = dq_out.get(), from.q_token_stride = q_heads * out_stride,
    from.q_head_stride = out_stride, from.q_rope_offset = out_offset;
    from.q_src = dq_src.get(), from.q_src_token_stride = q_heads * q_stride,
    from.q_src_head_stride = q_stride, from.q_src_offset = 128;
    MOESH_ASSERT_OK(RunRopeKvCacheWrite(from));
    MOESH_ASSERT_OK_AND_ASSIGN(auto cache, dcache.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(auto qb, dq.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(auto q_out, dq_out.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(auto q_src_after, dq_src.ToHost());
    EXPECT_EQ(ToFloats(q_src_after), ToFloats(ToBf16Rounding(q))) << "q_src is read only";
    for (int t = 0; t < tokens; ++t) {
      for (int h = 0; h < q_heads; ++h) {
        for (int d = 0; d < out_stride; ++d) {
          const size_t at = (static_cast<size_t>(t) * q_heads + h) * out_stride + d;
          if (d < out_offset || d >= out_offset + dim) {
            ASSERT_TRUE(std::isnan(testing::ToFloat(q_out[at]))) << "outside the slice";
            continue;
          }
          const size_t in_place =
              (static_cast<size_t>(t) * q_heads + h) * q_stride + 128 + (d - out_offset);
          ASSERT_EQ(testing::ToFloat(q_out[at]), testing::ToFloat(qb[in_place]))
              << "token " << t << " head " << h << " dim " << d;
        }
      }
    }

    std::vector<float> got, want;
    std::vector<bool> written(slots.size(), false);
    for (int t = 0; t < tokens; ++t) {
      float* q_ref = q.data() + static_cast<size_t>(t) * q_heads * q_stride;
      cpu::RopeParams rq{q_ref, q_heads, q_stride, 128, dim, pos[t], cpu::RopeLayout::kInterleaved,
                         &table};
      cpu::RunRope(rq);
      if (slot_map[t] < 0) continue;
      written[slot_map[t]] = true;
      std::vector<float> ref_row(kv.begin() + static_cast<size_t>(t) * kv_ld,
                                 kv.begin() + static_cast<size_t>(t) * kv_ld + row);
      if (with_norm) cpu::RmsNorm(ref_row.data(), w.data(), ref_row.data(), 1, rank, 1e-6f);
      cpu::RopeParams rk{ref_row.data(), 1, row, rank, dim, pos[t], cpu::RopeLayout::kInterleaved,
                         &table};
      cpu::RunRope(rk);
      for (int d = 0; d < row; ++d) {
        want.push_back(ref_row[d]);
        got.push_back(testing::ToFloat(cache[static_cast<size_t>(slot_map[t]) * row + d]));
      }
    }
    EXPECT_LE(RelErr(got, want), 1e-2);
    EXPECT_LE(RelErr(ToFloats(qb), q), 1e-2);
    // Slots nobody wrote are still poisoned: padding tokens wrote nothing.
    for (size_t s = 0; s < written.size(); ++s) {
      if (written[s]) continue;
      ASSERT_TRUE(std::isnan(testing::ToFloat(cache[s * row]))) << "slot " << s << " was written";
    }
  }
}

TEST(SiluAndMulTest, MatchesCpu) {
  MOESH_REQUIRE_GPU();
  // limit 0: plain; 1.5 against values of scale 2: most clamped (DeepSeek-V4's swiglu_limit).
  for (float limit : {0.0f, 1.5f}) {
    for (auto [m, i] : {std::pair{33, 1408}, std::pair{4, 10944}, std::pair{3, 13}}) {
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "m=" << m << " i=" << i << " limit=" << limit << " seed=" << seed);
      std::mt19937 rng(seed);
      std::vector<float> gu = Randn(static_cast<size_t>(m) * 2 * i, rng, 2.0f);
      MOESH_ASSERT_OK_AND_ASSIGN(auto dgu,
                                 Upload(ToBf16Rounding(gu)));  // gu now holds what the device sees
      MOESH_ASSERT_OK_AND_ASSIGN(auto dout, DeviceBuffer<bf16>::Create(static_cast<size_t>(m) * i));
      MOESH_ASSERT_OK(Poison(dout));
      SiluAndMulParams p;
      p.gate_up = dgu.get(), p.out = dout.get(), p.m = m, p.i = i, p.limit = limit;
      MOESH_ASSERT_OK(RunSiluAndMul(p));
      MOESH_ASSERT_OK_AND_ASSIGN(auto ob, dout.ToHost());
      std::vector<float> ref(static_cast<size_t>(m) * i), unclamped(ref.size());
      cpu::SiluAndMul(gu.data(), ref.data(), m, i, limit);
      cpu::SiluAndMul(gu.data(), unclamped.data(), m, i);
      EXPECT_LE(RelErr(ToFloats(ob), ref), 1e-2);
      if (limit > 0.0f) {
        EXPECT_GT(RelErr(unclamped, ref), 0.1) << "the limit clamps nothing here";
      }
    }
  }
}

}  // namespace
}  // namespace moesh::cuda
