// The FP8 KV cache on the device (KvCacheDtype::kFp8) against its CPU
// reference (kernels/cpu/fp8.h: Fp8KvRowLayout, PackFp8KvRow): the KV-write
// kernel's bytes, the generic MLA kernel reading FP8 rows at a tiny model's
// widths, and the benchmarks' random FP8 rows. The tuned decode kernel's FP8
// path is in mla_decode_test.cc.
#include <cmath>
#include <cstring>
#include <numeric>

#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/ref/mla_decode_ref.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::FreshSeed;
using testing::Poison;
using testing::Randn;
using testing::RelErr;
using testing::ScaleFp8Groups;
using testing::ToBf16Rounding;
using testing::Upload;

std::vector<uint8_t> Bytes(const std::vector<bf16>& units) {
  std::vector<uint8_t> b(units.size() * 2);
  std::memcpy(b.data(), units.data(), b.size());
  return b;
}

cpu::RopeTable Table(int dim) { return cpu::DefaultRopeTable(10000.0, dim); }

// Without the norm the kernel quantizes the bf16 inputs themselves: its codes
// and scales are cpu::PackFp8KvRow's byte for byte. With it, the normalized
// values differ from the CPU's by float rounding: the rows widen to within
// e4m3's step of the reference's. The rope part is the CPU's rotation within
// bf16 rounding; padding bytes are zero; slots of padding tokens untouched.
TEST(Fp8KvTest, KvCacheWriteMatchesCpuPack) {
  MOESH_REQUIRE_GPU();
  for (const cpu::Fp8KvRowLayout layout :
       {cpu::Fp8KvRowLayout{512, 64}, cpu::Fp8KvRowLayout{32, 8}}) {
    for (bool with_norm : {false, true}) {
      const uint32_t seed = FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "latent " << layout.latent << " with_norm " << with_norm << " seed=" << seed);
      std::mt19937 rng(seed);
      const int rank = layout.latent, dim = layout.rope, kv_ld = rank + dim + 16;
      const int num_blocks = 3, tokens = 70, stride = layout.bytes() / 2;
      const cpu::RopeTable table = Table(dim);
      std::vector<float> kv = Randn(static_cast<size_t>(tokens) * kv_ld, rng, 3.0f);
      ScaleFp8Groups(kv.data(), tokens, kv_ld, rank, rng);
      std::vector<float> w = Randn(rank, rng, 0.1f, 1.0f);
      const std::vector<bf16> kv16 = ToBf16Rounding(kv), w16 = ToBf16Rounding(w);  // in place too
      std::vector<int32_t> slots(num_blocks * kKvBlockSize), pos(tokens), slot_map(tokens);
      std::iota(slots.begin(), slots.end(), 0);
      std::shuffle(slots.begin(), slots.end(), rng);
      for (int t = 0; t < tokens; ++t) {
        slot_map[t] = t % 7 == 3 ? -1 : slots[t];
        pos[t] = 17 * t;
      }
      MOESH_ASSERT_OK_AND_ASSIGN(auto dkv, Upload(kv16));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dw, Upload(w16));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dslot, Upload(slot_map));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dpos, Upload(pos));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dfreq, Upload(table.inv_freq));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dcache, DeviceBuffer<bf16>::Create(slots.size() * stride));
      MOESH_ASSERT_OK(Poison(dcache));
      RopeKvCacheParams p;
      p.kv = dkv.get(), p.kv_ld = kv_ld, p.kv_norm_weight = with_norm ? dw.get() : nullptr;
      p.eps = 1e-6f;
      p.cache = dcache.get(), p.cache_row_stride = stride, p.num_blocks = num_blocks;
      p.cache_dtype = KvCacheDtype::kFp8;
      p.slot_mapping = dslot.get(), p.num_tokens = tokens, p.kv_lora_rank = rank;
      p.positions = dpos.get();
      p.rope = {dfreq.get(), table.attention_factor, dim, cpu::RopeLayout::kHalves};
      MOESH_ASSERT_OK(RunRopeKvCacheWrite(p));
      MOESH_ASSERT_OK_AND_ASSIGN(auto units, dcache.ToHost());
      const std::vector<uint8_t> cache = Bytes(units);

      std::vector<float> got_rows, want_rows;
      std::vector<bool> written(slots.size(), false);
      int code_mismatches = 0;
      for (int t = 0; t < tokens; ++t) {
        if (slot_map[t] < 0) continue;
        written[slot_map[t]] = true;
        std::vector<float> ref(kv.begin() + static_cast<size_t>(t) * kv_ld,
                               kv.begin() + static_cast<size_t>(t) * kv_ld + rank + dim);
        if (with_norm) cpu::RmsNorm(ref.data(), w.data(), ref.data(), 1, rank, 1e-6f);
        cpu::RopeParams rk{ref.data(), 1, rank + dim, rank, dim, pos[t], cpu::RopeLayout::kHalves,
                           &table};
        cpu::RunRope(rk);
        std::vector<uint8_t> want(static_cast<size_t>(layout.bytes()));
        cpu::PackFp8KvRow(ref.data(), layout, want.data());
        const uint8_t* got = cache.data() + static_cast<size_t>(slot_map[t]) * layout.bytes();
        for (int c = 0; c < layout.rope_offset(); ++c) code_mismatches += got[c] != want[c];
        for (int c = layout.rope_offset() + 2 * dim; c < layout.bytes(); ++c)
          ASSERT_EQ(got[c], 0) << "padding byte " << c << " of token " << t;
        std::vector<float> g(rank + dim), r(rank + dim);
        cpu::UnpackFp8KvRow(got, layout, g.data());
        cpu::UnpackFp8KvRow(want.data(), layout, r.data());
        got_rows.insert(got_rows.end(), g.begin(), g.end());
        want_rows.insert(want_rows.end(), r.begin(), r.end());
      }
      if (!with_norm) {
        EXPECT_EQ(code_mismatches, 0) << "codes and scales differ from cpu::PackFp8KvRow's";
      }
      EXPECT_LE(RelErr(got_rows, want_rows), with_norm ? 3e-2 : 1e-2);
      for (size_t s = 0; s < written.size(); ++s) {
        if (!written[s]) {
          ASSERT_EQ(cache[s * layout.bytes()], 0xff) << "slot " << s << " written";
        }
      }
    }
  }
}

// The generic MLA kernel on FP8 rows (a tiny model's 32 + 8, and V3's widths
// with a strided pool) equals the reference on the rows the FP8 cache gives.
TEST(Fp8KvTest, GenericMlaKernelReadsFp8Rows) {
  MOESH_REQUIRE_GPU();
  for (const cpu::Fp8KvRowLayout layout :
       {cpu::Fp8KvRowLayout{32, 8}, cpu::Fp8KvRowLayout{512, 64}}) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << "latent " << layout.latent << " seed=" << seed);
    std::mt19937 rng(seed);
    const int rank = layout.latent, rope = layout.rope, dim = rank + rope, heads = 4;
    const std::vector<int32_t> lens = {1, 70, 200};
    const int batch = static_cast<int>(lens.size()), max_blocks = 4,
              num_blocks = batch * max_blocks;
    std::vector<int32_t> table(static_cast<size_t>(num_blocks));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    const size_t rows = static_cast<size_t>(num_blocks) * kKvBlockSize;
    std::vector<float> cache = Randn(rows * dim, rng);
    std::vector<uint8_t> packed(rows * layout.bytes());
    ScaleFp8Groups(cache.data(), rows, dim, rank, rng);
    for (size_t r = 0; r < rows; ++r) {
      cpu::PackFp8KvRow(cache.data() + r * dim, layout, packed.data() + r * layout.bytes());
      cpu::UnpackFp8KvRow(packed.data() + r * layout.bytes(), layout, cache.data() + r * dim);
    }
    std::vector<uint16_t> units(packed.size() / 2);
    std::memcpy(units.data(), packed.data(), packed.size());
    std::vector<float> q = Randn(static_cast<size_t>(batch) * heads * dim, rng);
    const std::vector<bf16> q16 = ToBf16Rounding(q);
    std::vector<float> want(static_cast<size_t>(batch) * heads * rank), want_lse(batch * heads);
    ref::MlaDecodeRefParams r;
    r.q = q.data(), r.kv_cache = cache.data(), r.block_table = table.data(),
    r.seq_lens = lens.data();
    r.batch = batch, r.num_heads = heads, r.kv_lora_rank = rank, r.rope_dim = rope;
    r.max_blocks_per_seq = max_blocks, r.softmax_scale = 0.125f, r.out = want.data();
    r.lse = want_lse.data();
    ref::MlaDecodeRef(r);

    MOESH_ASSERT_OK_AND_ASSIGN(auto dq, Upload(q16));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dcache, DeviceBuffer<uint16_t>::Create(units.size()));
    MOESH_ASSERT_OK(dcache.CopyFrom(units));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dtable, Upload(table));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dlens, Upload(lens));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dout, DeviceBuffer<float>::Create(want.size()));
    MlaDecodeParams p;
    p.q = dq.get(), p.kv_cache = reinterpret_cast<const bf16*>(dcache.get());
    p.kv_dtype = KvCacheDtype::kFp8, p.kv_row_stride = layout.bytes() / 2;
    p.block_table = dtable.get(), p.seq_lens = dlens.get(), p.batch = batch, p.num_heads = heads;
    p.kv_lora_rank = rank, p.rope_dim = rope, p.num_blocks = num_blocks;
    p.max_blocks_per_seq = max_blocks, p.max_seq_len = 200, p.softmax_scale = 0.125f;
    p.out = dout.get(), p.out_type = OutType::kFloat32;
    MOESH_ASSERT_OK(RunMlaAttentionGeneric(p));
    MOESH_ASSERT_OK_AND_ASSIGN(auto got, dout.ToHost());
    EXPECT_LE(RelErr(got, want), 1e-4);
  }
}

// A sequence's rows gathered out of the paged pool (the MLA prefill's keys):
// FP8 rows come back as the CPU's UnpackFp8KvRow, bf16 rows as stored, both
// exactly, from a position inside a block through a shuffled block table.
TEST(Fp8KvTest, GatherKvRowsWidensFp8RowsExactly) {
  MOESH_REQUIRE_GPU();
  for (const bool fp8 : {true, false}) {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << "fp8 " << fp8 << " seed=" << seed);
    std::mt19937 rng(seed);
    const cpu::Fp8KvRowLayout layout{512, 64};
    const int dim = layout.latent + layout.rope, num_blocks = 6, from = 37, count = 250;
    const int stride = fp8 ? layout.bytes() / 2 : dim;  // 2-byte units
    std::vector<int32_t> table(num_blocks);
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    const size_t rows = static_cast<size_t>(num_blocks) * kKvBlockSize;
    std::vector<float> values = Randn(rows * dim, rng);
    ScaleFp8Groups(values.data(), rows, dim, layout.latent, rng);
    std::vector<uint16_t> units(rows * stride);
    for (size_t r = 0; r < rows; ++r) {
      float* v = values.data() + r * dim;
      if (fp8) {
        uint8_t* b = reinterpret_cast<uint8_t*>(units.data() + r * stride);
        cpu::PackFp8KvRow(v, layout, b);
        cpu::UnpackFp8KvRow(b, layout, v);
      } else {
        for (int d = 0; d < dim; ++d) {
          units[r * stride + d] = static_cast<__nv_bfloat16_raw>(testing::ToBf16(v[d])).x;
          v[d] = testing::RoundBf16(v[d]);
        }
      }
    }
    MOESH_ASSERT_OK_AND_ASSIGN(auto dcache, DeviceBuffer<uint16_t>::Create(units.size()));
    MOESH_ASSERT_OK(dcache.CopyFrom(units));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dtable, Upload(table));
    const int ldo = dim + 8;
    MOESH_ASSERT_OK_AND_ASSIGN(auto dout, DeviceBuffer<bf16>::Create(size_t{count} * ldo));
    MOESH_ASSERT_OK(Poison(dout));
    GatherKvRowsParams g;
    g.cache = reinterpret_cast<const bf16*>(dcache.get()), g.row_stride = stride;
    g.dtype = fp8 ? KvCacheDtype::kFp8 : KvCacheDtype::kBf16;
    g.latent = layout.latent, g.rope = layout.rope, g.block_table = dtable.get();
    g.num_blocks = num_blocks, g.from = from, g.count = count, g.out = dout.get(), g.ldo = ldo;
    MOESH_ASSERT_OK(RunGatherKvRows(g));
    MOESH_ASSERT_OK_AND_ASSIGN(auto got, dout.ToHost());
    int mismatches = 0;
    for (int i = 0; i < count; ++i) {
      const int pos = from + i;
      const float* want =
          values.data() +
          (static_cast<size_t>(table[pos / kKvBlockSize]) * kKvBlockSize + pos % kKvBlockSize) *
              dim;
      for (int d = 0; d < dim; ++d) {
        mismatches += testing::ToFloat(got[static_cast<size_t>(i) * ldo + d]) != want[d];
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// The launchers' checks of FP8 rows, before anything reaches the device (no
// GPU needed: zero tokens or an empty batch return after them). An FP8 row
// is narrower than its values (656 bytes for 576 values): its stride in
// 2-byte units is 328, which the bf16 checks would refuse.
TEST(Fp8KvTest, LaunchersTakeFp8RowStridesAndRefuseOtherShapes) {
  const float inv_freq[32] = {};
  RopeKvCacheParams w;
  w.kv = reinterpret_cast<const bf16*>(16), w.kv_ld = 576, w.kv_lora_rank = 512;
  w.cache = reinterpret_cast<bf16*>(16), w.num_blocks = 1;
  w.rope = {inv_freq, 1.0f, 64, cpu::RopeLayout::kHalves};
  w.cache_dtype = KvCacheDtype::kFp8, w.cache_row_stride = 328;
  EXPECT_TRUE(RunRopeKvCacheWrite(w).ok()) << RunRopeKvCacheWrite(w);
  w.cache_row_stride = 0;
  EXPECT_TRUE(RunRopeKvCacheWrite(w).ok()) << RunRopeKvCacheWrite(w);
  w.cache_row_stride = 300;  // under the row's 656 bytes
  EXPECT_EQ(RunRopeKvCacheWrite(w).code(), absl::StatusCode::kInvalidArgument);
  w.cache_row_stride = 330;  // 660 bytes: not whole 16 bytes (misaligned scales)
  EXPECT_EQ(RunRopeKvCacheWrite(w).code(), absl::StatusCode::kInvalidArgument);
  w.cache_row_stride = 0, w.cache = reinterpret_cast<bf16*>(24);  // not 16-byte aligned
  EXPECT_EQ(RunRopeKvCacheWrite(w).code(), absl::StatusCode::kInvalidArgument);
  w.cache = reinterpret_cast<bf16*>(16);
  w.cache_row_stride = 0, w.kv_lora_rank = 24, w.kv_ld = 88;  // not a multiple of 16
  EXPECT_EQ(RunRopeKvCacheWrite(w).code(), absl::StatusCode::kInvalidArgument);
  w.kv_lora_rank = 512, w.kv_ld = 576, w.cache_dtype = KvCacheDtype::kBf16,
  w.cache_row_stride = 328;  // a bf16 row of 576 values cannot be 328 units
  EXPECT_EQ(RunRopeKvCacheWrite(w).code(), absl::StatusCode::kInvalidArgument);

  MlaDecodeParams d;
  d.num_heads = 128, d.num_blocks = 1, d.max_blocks_per_seq = 1, d.batch = 0;
  d.kv_dtype = KvCacheDtype::kFp8, d.kv_row_stride = 328;
  EXPECT_TRUE(RunMlaDecode(d).ok()) << RunMlaDecode(d);
  // The 64-head kernel reads FP8 rows at any stride of whole 16 bytes from
  // the row's 656 up (V3.2's 912-byte rows); the 16-head FP8 kernel reads
  // dense blocks only.
  d.kv_row_stride = 576;
  EXPECT_TRUE(RunMlaDecode(d).ok()) << RunMlaDecode(d);
  d.kv_row_stride = 300;  // under the row
  EXPECT_EQ(RunMlaDecode(d).code(), absl::StatusCode::kInvalidArgument);
  d.kv_row_stride = 332;  // 664 bytes: not whole 16 bytes
  EXPECT_EQ(RunMlaDecode(d).code(), absl::StatusCode::kInvalidArgument);
  d.num_heads = 16, d.kv_row_stride = 456;
  EXPECT_EQ(RunMlaDecode(d).code(), absl::StatusCode::kInvalidArgument);
  d.num_heads = 128, d.kv_row_stride = 576, d.kv_dtype = KvCacheDtype::kBf16;
  EXPECT_TRUE(RunMlaDecode(d).ok()) << RunMlaDecode(d);

  // The generic kernel (checks after the batch's pointers, before the launch).
  MlaDecodeParams g;
  g.q = reinterpret_cast<const bf16*>(16), g.block_table = reinterpret_cast<const int32_t*>(16);
  g.seq_lens = reinterpret_cast<const int32_t*>(16), g.out = reinterpret_cast<void*>(16);
  g.batch = 1, g.num_heads = 4, g.kv_lora_rank = 32, g.rope_dim = 8, g.max_blocks_per_seq = 1;
  g.num_blocks = 1, g.kv_dtype = KvCacheDtype::kFp8;
  g.kv_cache = reinterpret_cast<const bf16*>(24);  // not 16-byte aligned
  EXPECT_EQ(RunMlaAttentionGeneric(g).code(), absl::StatusCode::kInvalidArgument);
  g.kv_cache = reinterpret_cast<const bf16*>(16), g.kv_row_stride = 36;  // 72 bytes
  EXPECT_EQ(RunMlaAttentionGeneric(g).code(), absl::StatusCode::kInvalidArgument);
  g.kv_row_stride = 24;  // 48 bytes: under the row's 64
  EXPECT_EQ(RunMlaAttentionGeneric(g).code(), absl::StatusCode::kInvalidArgument);
  g.kv_row_stride = 32, g.kv_lora_rank = 24;  // not a multiple of 16
  EXPECT_EQ(RunMlaAttentionGeneric(g).code(), absl::StatusCode::kInvalidArgument);

  // The row gather (no rows: returns after the checks).
  GatherKvRowsParams k;
  k.latent = 512, k.rope = 64, k.dtype = KvCacheDtype::kFp8, k.row_stride = 328;
  EXPECT_TRUE(RunGatherKvRows(k).ok()) << RunGatherKvRows(k);
  k.row_stride = 300;  // under the row's 656 bytes
  EXPECT_EQ(RunGatherKvRows(k).code(), absl::StatusCode::kInvalidArgument);
  k.row_stride = 0;  // the FP8 row's own 328
  EXPECT_TRUE(RunGatherKvRows(k).ok()) << RunGatherKvRows(k);
  k.dtype = KvCacheDtype::kBf16, k.row_stride = 328;  // a bf16 row of 576 values
  EXPECT_EQ(RunGatherKvRows(k).code(), absl::StatusCode::kInvalidArgument);
  k.row_stride = 0, k.ldo = 570;  // under the row
  EXPECT_EQ(RunGatherKvRows(k).code(), absl::StatusCode::kInvalidArgument);
}

// Random FP8 rows for benchmarks are rows PackFp8KvRow could make: finite,
// one power-of-two scale, padding zero.
TEST(Fp8KvTest, RandomRowsAreValidFp8Rows) {
  MOESH_REQUIRE_GPU();
  const cpu::Fp8KvRowLayout layout{512, 64};
  const size_t rows = 300;
  MOESH_ASSERT_OK_AND_ASSIGN(auto d, DeviceBuffer<uint8_t>::Create(rows * layout.bytes()));
  MOESH_ASSERT_OK(FillFp8KvRows(d.get(), rows, layout.latent, layout.rope, 7, 1.0f, nullptr));
  MOESH_ASSERT_OK_AND_ASSIGN(auto bytes, d.ToHost());
  std::vector<float> row(layout.latent + layout.rope);
  double sum_sq = 0.0;
  for (size_t r = 0; r < rows; ++r) {
    const uint8_t* b = bytes.data() + r * layout.bytes();
    cpu::UnpackFp8KvRow(b, layout, row.data());
    for (float v : row) {
      ASSERT_TRUE(std::isfinite(v)) << "row " << r;
      ASSERT_LE(std::fabs(v), 1.0f) << "row " << r;
      sum_sq += static_cast<double>(v) * v;
    }
    float s = 0.0f;
    std::memcpy(&s, b + layout.scales_offset(), 4);
    ASSERT_EQ(s, cpu::Fp8KvScale(1.0f));
    for (int c = layout.rope_offset() + 2 * layout.rope; c < layout.bytes(); ++c)
      ASSERT_EQ(b[c], 0);
  }
  // Uniform in [-1, 1): mean square about 1/3, not zeros.
  EXPECT_NEAR(sum_sq / (rows * row.size()), 1.0 / 3.0, 0.05);
}

}  // namespace
}  // namespace moesh::cuda
