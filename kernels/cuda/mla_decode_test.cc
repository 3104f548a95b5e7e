// MLA decode over the paged cache against the plain C++ reference
// (ref/mla_decode_ref.h), which is itself checked against the CPU engine's
// MLA attention (kernels/cpu/mla_attention.h) with identity absorbed weights.
#include "kernels/cuda/mla_decode.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>

#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/mla_attention.h"
#include "kernels/cuda/config.h"
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
using testing::ToFloats;
using testing::Upload;

constexpr int kRank = mla::kLatentDim, kRope = mla::kRopeDim, kDim = kRank + kRope;
constexpr float kScale = 0.1352f;  // ~ mscale^2 / sqrt(192), V2-Lite's

// A random paged layout: each sequence's blocks drawn from a shuffled pool,
// unused table entries INT_MAX so an over-read faults.
struct PagedBatch {
  std::vector<int32_t> seq_lens, block_table;
  int max_blocks_per_seq = 0, num_blocks = 0, max_seq_len = 0;
  std::vector<float> q, cache;  // bf16-rounded values
};

PagedBatch MakeBatch(const std::vector<int>& lens, int heads, std::mt19937& rng) {
  PagedBatch b;
  b.seq_lens.assign(lens.begin(), lens.end());
  b.max_seq_len = *std::max_element(lens.begin(), lens.end());
  b.max_blocks_per_seq = std::max(1, (b.max_seq_len + kKvBlockSize - 1) / kKvBlockSize + 1);
  int needed = 0;
  for (int l : lens) needed += (l + kKvBlockSize - 1) / kKvBlockSize;
  b.num_blocks = needed + 5;
  std::vector<int32_t> pool(b.num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  b.block_table.assign(lens.size() * b.max_blocks_per_seq, INT_MAX);
  int next = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int i = 0; i < (lens[s] + kKvBlockSize - 1) / kKvBlockSize; ++i) {
      b.block_table[s * b.max_blocks_per_seq + i] = pool[next++];
    }
  }
  b.q = Randn(lens.size() * heads * kDim, rng);
  b.cache = Randn(static_cast<size_t>(b.num_blocks) * kKvBlockSize * kDim, rng);
  return b;
}

TEST(MlaDecodeRefTest, MatchesCpuMlaAttentionWithIdentityWeights) {
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  const int heads = 2;
  PagedBatch b = MakeBatch({150}, heads, rng);
  std::vector<float> out(heads * kRank), lse(heads);
  ref::MlaDecodeRefParams r;
  r.q = b.q.data(), r.kv_cache = b.cache.data(), r.block_table = b.block_table.data();
  r.seq_lens = b.seq_lens.data(), r.batch = 1, r.num_heads = heads, r.kv_lora_rank = kRank;
  r.rope_dim = kRope, r.max_blocks_per_seq = b.max_blocks_per_seq, r.softmax_scale = kScale;
  r.out = out.data(), r.lse = lse.data();
  ref::MlaDecodeRef(r);

  // The CPU engine's op on the gathered rows: q_nope = q_latent with W_UK = I, W_UV = I.
  const int len = b.seq_lens[0];
  std::vector<float> kv(static_cast<size_t>(len) * kDim);
  for (int t = 0; t < len; ++t) {
    const float* row =
        b.cache.data() +
        (static_cast<size_t>(b.block_table[t / kKvBlockSize]) * kKvBlockSize + t % kKvBlockSize) *
            kDim;
    std::copy(row, row + kDim, kv.begin() + static_cast<size_t>(t) * kDim);
  }
  std::vector<float> w_kv_b(static_cast<size_t>(heads) * 2 * kRank * kRank, 0.0f);
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < 2 * kRank; ++i)
      w_kv_b[(static_cast<size_t>(h) * 2 * kRank + i) * kRank + i % kRank] = 1.0f;
  }
  std::vector<float> cpu_out(heads * kRank);
  cpu::MlaAttentionParams c;
  c.q = b.q.data(), c.num_q = 1, c.num_heads = heads, c.qk_nope_head_dim = kRank,
  c.qk_rope_head_dim = kRope;
  c.kv_lora_rank = kRank, c.v_head_dim = kRank, c.kv = kv.data(), c.num_kv = len,
  c.q_start_pos = len - 1;
  c.w_kv_b = w_kv_b.data(), c.softmax_scale = kScale, c.out = cpu_out.data();
  cpu::RunMlaAttention(c);
  EXPECT_LE(RelErr(out, cpu_out), 1e-5);
}

struct DecodeCase {
  const char* name;  // a gtest name: sanitizer runs filter on it
  std::vector<int> lens;
  int heads;
  OutType out;
  int splits;  // 0: PlanMlaDecode's
};

const DecodeCase kCases[] = {
    {"RaggedPlannedSplitsFp32", {1, 63, 64, 65, 700, 2500}, 16, OutType::kFloat32, 0},
    {"RaggedOneSplitBf16", {1, 63, 64, 65, 700, 2500}, 16, OutType::kBf16, 1},
    {"PaddedHeadsEmptySequenceNineSplits", {0, 130, 1337}, 20, OutType::kFloat32, 9},
    {"Heads128Planned", {257, 1500}, 128, OutType::kBf16, 0},
    {"Heads128RaggedPlannedFp32", {1, 64, 65, 127, 0, 4097}, 128, OutType::kFloat32, 0},
    {"Heads64SevenSplits", {130, 1000}, 64, OutType::kBf16, 7},
    {"PaddedHeads80OneSplit", {3, 200}, 80, OutType::kFloat32, 1},
    {"OneLongSequencePlanned", {8191}, 16, OutType::kFloat32, 0},
};

void PrintTo(const DecodeCase& c, std::ostream* os) { *os << c.name; }

class MlaDecodeTest : public ::testing::TestWithParam<DecodeCase> {};

std::vector<uint16_t> Bits(const std::vector<bf16>& v) {
  std::vector<uint16_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(uint16_t));
  return out;
}

// The cache as FP8 rows (cpu::PackFp8KvRow) in 2-byte units; `cache`
// becomes what they hold. Each row's 128-value groups are first scaled
// apart (ScaleFp8Groups).
std::vector<uint16_t> PackFp8(std::vector<float>& cache, std::mt19937& rng) {
  const cpu::Fp8KvRowLayout layout{kRank, kRope};
  const size_t rows = cache.size() / kDim;
  std::vector<uint16_t> units(rows * layout.bytes() / 2);
  uint8_t* bytes = reinterpret_cast<uint8_t*>(units.data());
  ScaleFp8Groups(cache.data(), rows, kDim, kRank, rng);
  for (size_t r = 0; r < rows; ++r) {
    cpu::PackFp8KvRow(cache.data() + r * kDim, layout, bytes + r * layout.bytes());
    cpu::UnpackFp8KvRow(bytes + r * layout.bytes(), layout, cache.data() + r * kDim);
  }
  return units;
}

// The pool a selection reads (DeepSeek-V3.2's sparse attention): sequence
// s's rows t < lens[s] of `b` scattered to random distinct positions of a
// sequence twice as long, in rows kSelectedStride wide (V3.2's [latent |
// rope | index key]); every other value NaN, so a row read wrongly shows.
constexpr int kSelectedStride = kDim + 128;
struct SelectedPool {
  std::vector<float> rows;  // [num_blocks * 64, kSelectedStride]
  std::vector<int32_t> block_table, index;
  int num_blocks = 0, max_blocks_per_seq = 0, index_stride = 0;
};

SelectedPool ScatterRows(const PagedBatch& b, std::mt19937& rng) {
  SelectedPool pool;
  const int batch = static_cast<int>(b.seq_lens.size());
  pool.index_stride = b.max_seq_len + 3;  // wider than the rows: a stride mix-up shows
  std::vector<int> lens(batch);
  for (int s = 0; s < batch; ++s) {
    lens[s] = 2 * b.seq_lens[s] + 7;
    pool.max_blocks_per_seq =
        std::max(pool.max_blocks_per_seq, (lens[s] + kKvBlockSize - 1) / kKvBlockSize);
    pool.num_blocks += (lens[s] + kKvBlockSize - 1) / kKvBlockSize;
  }
  std::vector<int32_t> ids(pool.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  pool.block_table.assign(static_cast<size_t>(batch) * pool.max_blocks_per_seq, INT_MAX);
  pool.rows.assign(static_cast<size_t>(pool.num_blocks) * kKvBlockSize * kSelectedStride, NAN);
  pool.index.assign(static_cast<size_t>(batch) * pool.index_stride, INT_MAX);
  int next = 0;
  for (int s = 0; s < batch; ++s) {
    for (int i = 0; i < (lens[s] + kKvBlockSize - 1) / kKvBlockSize; ++i) {
      pool.block_table[static_cast<size_t>(s) * pool.max_blocks_per_seq + i] = ids[next++];
    }
    std::vector<int> pos(lens[s]);
    std::iota(pos.begin(), pos.end(), 0);
    std::shuffle(pos.begin(), pos.end(), rng);
    for (int t = 0; t < b.seq_lens[s]; ++t) {
      const int from =
          b.block_table[static_cast<size_t>(s) * b.max_blocks_per_seq + t / kKvBlockSize] *
              kKvBlockSize +
          t % kKvBlockSize;
      const int p = pos[t];
      const int to =
          pool.block_table[static_cast<size_t>(s) * pool.max_blocks_per_seq + p / kKvBlockSize] *
              kKvBlockSize +
          p % kKvBlockSize;
      std::copy_n(&b.cache[static_cast<size_t>(from) * kDim], kDim,
                  &pool.rows[static_cast<size_t>(to) * kSelectedStride]);
      pool.index[static_cast<size_t>(s) * pool.index_stride + t] = p;
    }
  }
  return pool;
}

// The selection's pool as FP8 rows `stride` units (2 bytes) apart (V3.2's on
// the GPU, kFp8SelectedStride: [FP8 row | bf16 index key]; or dense, 328):
// rows that hold a scattered row packed (exactly: its values came out of
// PackFp8), every other byte 0xFF (NaN as an e4m3 code, a float scale and a
// bf16 rope value).
constexpr int kFp8SelectedStride = (656 + 256) / 2, kFp8DenseStride = 656 / 2;
std::vector<uint16_t> PackFp8Pool(const SelectedPool& pool, int stride) {
  const cpu::Fp8KvRowLayout layout{kRank, kRope};
  const size_t rows = pool.rows.size() / kSelectedStride;
  std::vector<uint16_t> units(rows * stride, 0xFFFF);
  uint8_t* bytes = reinterpret_cast<uint8_t*>(units.data());
  for (size_t r = 0; r < rows; ++r) {
    const float* row = pool.rows.data() + r * kSelectedStride;
    if (std::isnan(row[0])) continue;
    cpu::PackFp8KvRow(row, layout, bytes + r * stride * 2);
  }
  return units;
}

// Rows past each sequence's end in its last block become NaN: the kernels
// must not let them reach O (0 · NaN), as a pool's stale rows could hold
// anything; the reference never reads them.
void PoisonTails(PagedBatch& b) {
  for (size_t s = 0; s < b.seq_lens.size(); ++s) {
    const int len = b.seq_lens[s];
    if (len % kKvBlockSize == 0) continue;
    const int block = b.block_table[s * b.max_blocks_per_seq + len / kKvBlockSize];
    for (int t = len % kKvBlockSize; t < kKvBlockSize; ++t) {
      std::fill_n(&b.cache[(static_cast<size_t>(block) * kKvBlockSize + t) * kDim], kDim,
                  std::numeric_limits<float>::quiet_NaN());
    }
  }
}

// Every case through each of `tiles`, against the reference; with `dtype`
// kFp8 the cache holds FP8 rows and the reference reads what they hold;
// `selected`: the kernel reads each sequence's rows through a selection out
// of a wider strided pool (ScatterRows) instead; FP8 rows kFp8SelectedStride
// apart, or with `dense_fp8_pool` 328 (passed as kv_row_stride 0).
void CheckCase(const DecodeCase& c, std::initializer_list<MlaTileConfig> tiles,
               KvCacheDtype dtype = KvCacheDtype::kBf16, bool selected = false,
               bool dense_fp8_pool = false) {
  MOESH_ASSERT_OK_AND_ASSIGN(DeviceInfo info, CurrentDeviceInfo());
  {
    const uint32_t seed = FreshSeed();
    SCOPED_TRACE(::testing::Message() << c.name << " seed=" << seed);
    std::mt19937 rng(seed);
    PagedBatch b = MakeBatch(c.lens, c.heads, rng);
    PoisonTails(b);
    const int batch = static_cast<int>(c.lens.size());
    MOESH_ASSERT_OK_AND_ASSIGN(auto dq, Upload(ToBf16Rounding(b.q)));
    const bool fp8 = dtype == KvCacheDtype::kFp8;
    MOESH_ASSERT_OK_AND_ASSIGN(
        auto dcache, fp8 ? Upload(PackFp8(b.cache, rng)) : Upload(Bits(ToBf16Rounding(b.cache))));
    MOESH_ASSERT_OK_AND_ASSIGN(auto dtable, Upload(b.block_table));
    SelectedPool pool;
    DeviceBuffer<uint16_t> dpool;
    DeviceBuffer<int32_t> dpool_table, dindex;
    if (selected) {  // b.cache is bf16-rounded (or FP8 values) by now
      pool = ScatterRows(b, rng);
      MOESH_ASSERT_OK_AND_ASSIGN(
          dpool,
          fp8 ? Upload(PackFp8Pool(pool, dense_fp8_pool ? kFp8DenseStride : kFp8SelectedStride))
              : Upload(Bits(ToBf16Rounding(pool.rows))));
      MOESH_ASSERT_OK_AND_ASSIGN(dpool_table, Upload(pool.block_table));
      MOESH_ASSERT_OK_AND_ASSIGN(dindex, Upload(pool.index));
    }
    MOESH_ASSERT_OK_AND_ASSIGN(auto dlens, Upload(b.seq_lens));
    const size_t out_elems = static_cast<size_t>(batch) * c.heads * kRank;
    std::vector<float> ref_out(out_elems), ref_lse(static_cast<size_t>(batch) * c.heads);
    ref::MlaDecodeRefParams r;
    r.q = b.q.data(), r.kv_cache = b.cache.data(), r.block_table = b.block_table.data();
    r.seq_lens = b.seq_lens.data(), r.batch = batch, r.num_heads = c.heads, r.kv_lora_rank = kRank;
    r.rope_dim = kRope, r.max_blocks_per_seq = b.max_blocks_per_seq, r.softmax_scale = kScale;
    r.out = ref_out.data(), r.lse = ref_lse.data();
    ref::MlaDecodeRef(r);
    double worst = 0.0;
    for (MlaTileConfig tile : tiles) {
      SCOPED_TRACE(::testing::Message() << "tile config " << static_cast<int>(tile));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dout32, DeviceBuffer<float>::Create(out_elems));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dout16, DeviceBuffer<bf16>::Create(out_elems));
      MOESH_ASSERT_OK_AND_ASSIGN(auto dlse,
                                 DeviceBuffer<float>::Create(static_cast<size_t>(batch) * c.heads));
      MOESH_ASSERT_OK(Poison(dout32));
      MOESH_ASSERT_OK(Poison(dout16));
      MOESH_ASSERT_OK(Poison(dlse));
      const MlaDecodePlan plan =
          PlanMlaDecode(batch, c.heads, b.max_seq_len, info.num_sms, tile, dtype);
      const int splits = c.splits ? c.splits : plan.num_splits;
      const size_t ws_bytes = MlaDecodeWorkspaceBytes(batch, c.heads, splits);
      MOESH_ASSERT_OK_AND_ASSIGN(auto dws, DeviceBuffer<uint8_t>::Create(ws_bytes));
      MOESH_ASSERT_OK(Poison(dws));

      MlaDecodeParams p;
      p.q = dq.get(), p.kv_cache = reinterpret_cast<const bf16*>(dcache.get());
      p.kv_dtype = dtype, p.block_table = dtable.get(), p.seq_lens = dlens.get();
      p.batch = batch, p.num_heads = c.heads, p.num_blocks = b.num_blocks;
      p.max_blocks_per_seq = b.max_blocks_per_seq, p.max_seq_len = b.max_seq_len,
      p.softmax_scale = kScale;
      p.out_type = c.out;
      p.out = c.out == OutType::kFloat32 ? static_cast<void*>(dout32.get())
                                         : static_cast<void*>(dout16.get());
      p.lse = dlse.get(), p.num_splits = splits, p.workspace = dws.get(),
      p.workspace_bytes = ws_bytes;
      p.tile = tile;
      if (selected) {
        p.kv_cache = reinterpret_cast<const bf16*>(dpool.get());
        p.kv_row_stride = !fp8 ? kSelectedStride : dense_fp8_pool ? 0 : kFp8SelectedStride;
        p.block_table = dpool_table.get(), p.num_blocks = pool.num_blocks;
        p.max_blocks_per_seq = pool.max_blocks_per_seq;
        p.kv_index = dindex.get(), p.kv_index_stride = pool.index_stride;
      }
      MOESH_ASSERT_OK(RunMlaDecode(p));
      MOESH_ASSERT_OK(CudaStatus(cudaDeviceSynchronize(), "decode"));

      std::vector<float> out;
      if (c.out == OutType::kFloat32) {
        MOESH_ASSERT_OK_AND_ASSIGN(out, dout32.ToHost());
      } else {
        MOESH_ASSERT_OK_AND_ASSIGN(auto o16, dout16.ToHost());
        out = ToFloats(o16);
      }
      MOESH_ASSERT_OK_AND_ASSIGN(auto lse, dlse.ToHost());
      // Per sequence, so a wrong short sequence is not hidden by long ones.
      for (int s = 0; s < batch; ++s) {
        const size_t begin = static_cast<size_t>(s) * c.heads * kRank,
                     end = begin + static_cast<size_t>(c.heads) * kRank;
        std::vector<float> o(out.begin() + begin, out.begin() + end),
            rf(ref_out.begin() + begin, ref_out.begin() + end);
        if (c.lens[s] == 0) {
          for (float v : o) ASSERT_EQ(v, 0.0f) << "sequence " << s << " (empty) must give zeros";
        } else {
          const double err = RelErr(o, rf);
          worst = std::max(worst, err);
          EXPECT_LE(err, 1e-2) << "sequence " << s << " len " << c.lens[s] << " splits " << splits;
        }
        for (int h = 0; h < c.heads; ++h) {
          const float got = lse[static_cast<size_t>(s) * c.heads + h],
                      want = ref_lse[static_cast<size_t>(s) * c.heads + h];
          if (std::isinf(want)) {
            EXPECT_TRUE(std::isinf(got) && got < 0) << "sequence " << s << " head " << h;
          } else {
            EXPECT_NEAR(got, want, 5e-3) << "sequence " << s << " head " << h;
          }
        }
      }
    }
    std::printf("  %-42s max rel err over sequences and tiles %.2e\n", c.name, worst);
  }
}

// The 16-head kernel's tile shapes.
TEST_P(MlaDecodeTest, MatchesReference) {
  MOESH_REQUIRE_GPU();
  CheckCase(GetParam(), {MlaTileConfig::kTokens64Stages2, MlaTileConfig::kTokens32Stages4,
                         MlaTileConfig::kTokens32Stages5, MlaTileConfig::kTokens32Stages2});
}

// The 64-head wgmma kernel (mla_decode_wide.cu), head counts padded to 64.
TEST_P(MlaDecodeTest, WideMatchesReference) {
  MOESH_REQUIRE_GPU();
  CheckCase(GetParam(), {MlaTileConfig::kHeads64Tokens64Stages2});
}

// FP8 rows (--kv_cache_dtype fp8) through the 16-head FP8 kernel's tiles, and
// through kDefault (the 64-head FP8 kernel from 64 heads up, else the 16-head
// one) and the 64-head configuration (the 64-head FP8 kernel at any head
// count, padded to 64).
TEST_P(MlaDecodeTest, Fp8RowsMatchReference) {
  MOESH_REQUIRE_GPU();
  CheckCase(GetParam(),
            {MlaTileConfig::kDefault, MlaTileConfig::kHeads64Tokens64Stages2,
             MlaTileConfig::kTokens64Stages2, MlaTileConfig::kTokens32Stages4,
             MlaTileConfig::kTokens32Stages5, MlaTileConfig::kTokens32Stages2},
            KvCacheDtype::kFp8);
}

// What RunMlaDecode takes with a selection or wider rows, checked before
// anything reaches the device (an empty batch: no GPU needed): bf16 rows
// with a 16-head tile, FP8 rows with the 64-head one.
TEST(MlaDecodeArgsTest, SelectedRowsNeedAKernelThatReadsThem) {
  const int32_t fake = 0;
  MlaDecodeParams d;
  d.kv_lora_rank = kRank, d.rope_dim = kRope, d.num_heads = 128, d.num_blocks = 4;
  d.max_blocks_per_seq = 4, d.max_seq_len = 100, d.batch = 0;
  d.kv_index = &fake, d.kv_index_stride = 100, d.kv_row_stride = kDim + 128;
  d.tile = MlaTileConfig::kTokens32Stages2;
  EXPECT_TRUE(RunMlaDecode(d).ok()) << RunMlaDecode(d);
  d.kv_row_stride = 0;  // dense rows, selected
  EXPECT_TRUE(RunMlaDecode(d).ok()) << RunMlaDecode(d);
  d.tile = MlaTileConfig::kDefault;  // 128 heads: the 64-head kernel, which reads dense blocks
  EXPECT_EQ(RunMlaDecode(d).code(), absl::StatusCode::kInvalidArgument);
  d.tile = MlaTileConfig::kTokens64Stages2;
  d.kv_index_stride = 99;  // under max_seq_len
  EXPECT_EQ(RunMlaDecode(d).code(), absl::StatusCode::kInvalidArgument);
  d.kv_index_stride = 100, d.kv_row_stride = kDim + 4;  // not whole 16 bytes
  EXPECT_EQ(RunMlaDecode(d).code(), absl::StatusCode::kInvalidArgument);
  d.kv_row_stride = kDim - 8;  // narrower than a row
  EXPECT_EQ(RunMlaDecode(d).code(), absl::StatusCode::kInvalidArgument);
  d.kv_row_stride = 0, d.kv_dtype = KvCacheDtype::kFp8;  // FP8 rows, a 16-head tile: dense only
  EXPECT_EQ(RunMlaDecode(d).code(), absl::StatusCode::kInvalidArgument);
  d.tile = MlaTileConfig::kHeads64Tokens64Stages2;  // FP8 rows, the 64-head tile: selected too
  EXPECT_TRUE(RunMlaDecode(d).ok()) << RunMlaDecode(d);
  d.kv_row_stride = (656 + 256) / 2;  // V3.2's FP8 rows with their index key
  EXPECT_TRUE(RunMlaDecode(d).ok()) << RunMlaDecode(d);
  d.kv_row_stride = 656 / 2 + 4;  // not whole 16 bytes
  EXPECT_EQ(RunMlaDecode(d).code(), absl::StatusCode::kInvalidArgument);
  d.kv_row_stride = 656 / 2 - 8;  // narrower than an FP8 row
  EXPECT_EQ(RunMlaDecode(d).code(), absl::StatusCode::kInvalidArgument);
  d.kv_row_stride = 0, d.tile = MlaTileConfig::kTokens64Stages2;
  d.kv_index = nullptr;
  EXPECT_TRUE(RunMlaDecode(d).ok()) << RunMlaDecode(d);
  d.kv_row_stride = kDim + 128;  // FP8 rows: their own stride only
  EXPECT_EQ(RunMlaDecode(d).code(), absl::StatusCode::kInvalidArgument);
  d.kv_dtype = KvCacheDtype::kBf16, d.tile = MlaTileConfig::kDefault;  // strided, 64-head tile
  EXPECT_EQ(RunMlaDecode(d).code(), absl::StatusCode::kInvalidArgument);
  d.tile = MlaTileConfig::kTokens32Stages4;  // strided rows, no selection: the 16-head kernel
  EXPECT_TRUE(RunMlaDecode(d).ok()) << RunMlaDecode(d);
}

// DeepSeek-V3.2's selection read straight from the pool (no gathered copy):
// the 16-head kernel's tiles, rows fetched one by one through kv_index from
// rows wider than 576 values.
TEST_P(MlaDecodeTest, SelectedRowsMatchReference) {
  MOESH_REQUIRE_GPU();
  CheckCase(GetParam(),
            {MlaTileConfig::kTokens64Stages2, MlaTileConfig::kTokens32Stages4,
             MlaTileConfig::kTokens32Stages5, MlaTileConfig::kTokens32Stages2},
            KvCacheDtype::kBf16, /*selected=*/true);
}

// FP8 rows read the same way (V3.2's sparse attention on an FP8 pool, rows
// 912 bytes apart) by the 64-head kernel at any head count (padded to 64; a
// CTA pair from 65 heads up), its producer fetching each row one by one.
TEST_P(MlaDecodeTest, Fp8SelectedRowsMatchReference) {
  MOESH_REQUIRE_GPU();
  CheckCase(GetParam(), {MlaTileConfig::kHeads64Tokens64Stages2}, KvCacheDtype::kFp8,
            /*selected=*/true);
}

// The same over a pool of plain 656-byte FP8 rows (kv_row_stride 0).
TEST_P(MlaDecodeTest, Fp8SelectedDenseRowsMatchReference) {
  MOESH_REQUIRE_GPU();
  CheckCase(GetParam(), {MlaTileConfig::kHeads64Tokens64Stages2}, KvCacheDtype::kFp8,
            /*selected=*/true, /*dense_fp8_pool=*/true);
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaDecodeTest, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<DecodeCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace moesh::cuda
