// The lightning indexer's kernels against their CPU references, on random
// bf16 inputs (so both sides read identical values):
//   * RunIndexer over paged cache rows (DeepSeek-V3.2) selects exactly the
//     rows cpu::RunDsaIndexer selects, and writes the scores the formula
//     gives, at the goldens' widths and at V3.2's (64 heads of 128, top-512
//     of 2100 rows; on the CUDA and the tensor cores), and every row where
//     the query sees no more than top_k; over V4's entry pool (a key per
//     `rate` tokens, after the kv entry in each row) the same;
//   * RunIndexKey writes LayerNorm + rotate-half RoPE as cpu::LayerNorm and
//     cpu::RunRope compute them, and skips padding slots;
//   * RunMlaAttentionGeneric with a row index over strided rows equals the
//     dense kernel over the selected rows laid out contiguously.
// Skips (with a message) where no GPU is present.
#include "kernels/cuda/dsa_ops.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::FreshSeed;
using testing::Randn;
using testing::RelErr;
using testing::ToBf16Rounding;
using testing::Upload;

// The selections the GPU wrote, as sets.
std::vector<std::set<int>> Selections(const std::vector<int32_t>& selected,
                                      const std::vector<int32_t>& count, int top_k) {
  std::vector<std::set<int>> out(count.size());
  for (size_t i = 0; i < count.size(); ++i) {
    for (int j = 0; j < count[i]; ++j) out[i].insert(selected[i * top_k + j]);
  }
  return out;
}

struct CacheCase {
  int heads, dim, len, num_q, top_k, row_width, key_offset;
};

class IndexerCacheTest : public ::testing::TestWithParam<CacheCase> {};

// Each query a sequence of its own (its own blocks, shuffled, and keys), of
// length len - num_q + i + 1: a mix-up of tokens' block tables or keys shows.
TEST_P(IndexerCacheTest, SelectsAsTheCpuIndexer) {
  MOESH_REQUIRE_GPU();
  const CacheCase k = GetParam();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int blocks_used = (k.len + kKvBlockSize - 1) / kKvBlockSize;
  const int num_blocks = k.num_q * blocks_used + 3;
  std::vector<int32_t> blocks(num_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<float> cache =
      Randn(static_cast<size_t>(num_blocks) * kKvBlockSize * k.row_width, rng);
  std::vector<float> q = Randn(static_cast<size_t>(k.num_q) * k.heads * k.dim, rng);
  const int ldw = k.heads + 3;
  std::vector<float> w = Randn(static_cast<size_t>(k.num_q) * ldw, rng);
  const std::vector<bf16> cache_b = ToBf16Rounding(cache), q_b = ToBf16Rounding(q),
                          w_b = ToBf16Rounding(w);
  std::vector<int32_t> seq_lens(k.num_q), table(static_cast<size_t>(k.num_q) * blocks_used);
  for (int i = 0; i < k.num_q; ++i) {
    seq_lens[i] = k.len - k.num_q + i + 1;
    std::copy_n(blocks.begin() + static_cast<size_t>(i) * blocks_used, blocks_used,
                table.begin() + static_cast<size_t>(i) * blocks_used);
  }
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(k.heads)),
              scale = 1.0f / std::sqrt(static_cast<float>(k.dim));
  // Query i's keys in position order, and its scores in double.
  auto key_of = [&](int i, int j) {
    const size_t row =
        static_cast<size_t>(table[static_cast<size_t>(i) * blocks_used + j / kKvBlockSize]) *
            kKvBlockSize +
        j % kKvBlockSize;
    return &cache[row * k.row_width + k.key_offset];
  };

  MOESH_ASSERT_OK_AND_ASSIGN(auto d_cache, Upload(cache_b));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_q, Upload(q_b));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_w, Upload(w_b));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_lens, Upload(seq_lens));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_table, Upload(table));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_scores,
                             DeviceBuffer<float>::Create(static_cast<size_t>(k.num_q) * k.len));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_sel,
                             DeviceBuffer<int32_t>::Create(static_cast<size_t>(k.num_q) * k.top_k));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_count, DeviceBuffer<int32_t>::Create(k.num_q));
  // DeepSeek's shape also on the tensor cores (IndexerParams::tensor_cores).
  const bool mma_shape = k.heads == 64 && k.dim == 128;
  for (const bool tensor_cores : {false, true}) {
    if (tensor_cores && !mma_shape) break;
    SCOPED_TRACE(tensor_cores ? "tensor cores" : "CUDA cores");
    MOESH_ASSERT_OK(testing::Poison(d_sel));
    MOESH_ASSERT_OK(testing::Poison(d_scores));
    IndexerParams p;
    p.tensor_cores = tensor_cores;
    p.q = d_q.get(), p.w = d_w.get(), p.ldw = ldw, p.w_scale = w_scale, p.scale = scale;
    p.num_tokens = k.num_q, p.num_heads = k.heads, p.head_dim = k.dim, p.rate = 1;
    p.top_k = k.top_k;
    p.seq_lens = d_lens.get(), p.key_cache = d_cache.get(), p.key_row_width = k.row_width,
    p.key_offset = k.key_offset;
    p.block_table = d_table.get(), p.max_blocks_per_seq = blocks_used;
    p.scores = d_scores.get(), p.max_keys = k.len, p.selected = d_sel.get(),
    p.count = d_count.get();
    MOESH_ASSERT_OK(RunIndexer(p));
    MOESH_ASSERT_OK(CudaStatus(cudaDeviceSynchronize(), "sync"));
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<int32_t> sel, d_sel.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<int32_t> count, d_count.ToHost());
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> scores, d_scores.ToHost());
    const std::vector<std::set<int>> got = Selections(sel, count, k.top_k);
    double worst = 0.0;  // |score - reference| over the sum of |terms|
    for (int i = 0; i < k.num_q; ++i) {
      const int len = seq_lens[i];
      std::vector<float> keys(static_cast<size_t>(len) * k.dim), weights(k.heads);
      for (int j = 0; j < len; ++j) {
        std::copy_n(key_of(i, j), k.dim, &keys[static_cast<size_t>(j) * k.dim]);
      }
      for (int h = 0; h < k.heads; ++h) weights[h] = w[i * ldw + h] * w_scale;
      std::vector<uint8_t> mask(len);
      cpu::DsaIndexerParams cp;
      cp.q = &q[static_cast<size_t>(i) * k.heads * k.dim], cp.num_q = 1, cp.num_heads = k.heads;
      cp.head_dim = k.dim, cp.k = keys.data(), cp.k_row_stride = k.dim, cp.num_kv = len;
      cp.q_start_pos = len - 1, cp.weights = weights.data(), cp.softmax_scale = scale;
      cp.top_k = k.top_k, cp.mask = mask.data();
      cpu::RunDsaIndexer(cp);
      std::set<int> want;
      for (int j = 0; j < len; ++j) {
        if (mask[j]) want.insert(j);
      }
      EXPECT_EQ(count[i], std::min(k.top_k, len)) << "query " << i;
      EXPECT_EQ(got[i], want) << "query " << i;
      if (len <= k.top_k) continue;  // every row is taken; no scores are written
      for (int j = 0; j < len; ++j) {
        double ref = 0.0, mag = 0.0;
        for (int h = 0; h < k.heads; ++h) {
          double dot = 0.0;
          for (int x = 0; x < k.dim; ++x) {
            dot += static_cast<double>(q[(static_cast<size_t>(i) * k.heads + h) * k.dim + x]) *
                   keys[static_cast<size_t>(j) * k.dim + x];
          }
          ref += std::max(dot, 0.0) * weights[h] * scale;
          mag += std::fabs(std::max(dot, 0.0) * weights[h] * scale);
        }
        const double e =
            std::fabs(scores[static_cast<size_t>(i) * k.len + j] - ref) / std::max(mag, 1e-30);
        worst = std::isnan(e) ? INFINITY : std::max(worst, e);
      }
    }
    EXPECT_LE(worst, 1e-5) << "scores against the formula in double";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, IndexerCacheTest,
    ::testing::Values(CacheCase{6, 32, 300, 6, 8, 80, 40},         // the v32 golden's widths
                      CacheCase{64, 128, 2100, 3, 512, 704, 576},  // DeepSeek-V3.2's
                      // Its shape over ragged key counts (not whole 32-key warps or CTAs),
                      // and under one CTA of keys.
                      CacheCase{64, 128, 1000, 17, 300, 704, 576},
                      CacheCase{64, 128, 200, 9, 150, 704, 576},
                      CacheCase{8, 16, 5, 5, 8, 24, 8}));  // every row seen

// V4's CSA layers: the keys are a sequence's entries (one per `rate` tokens)
// in the entry pool, entry e at its row e, after the kv entry.
TEST(IndexerEntriesTest, SelectsAsTheCpuIndexer) {
  MOESH_REQUIRE_GPU();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int heads = 8, dim = 16, rate = 4, top_k = 5, row_width = 48, offset = 32, max_len = 256;
  const int blocks = max_len / kKvBlockSize;
  // Two sequences, two queries each: lengths 9 (2 entries: all) and 230 (57
  // entries) of sequence 0 (blocks 0..3), 100 and 101 of sequence 1 (4..7).
  const std::vector<int32_t> seq_lens = {9, 230, 100, 101}, seq = {0, 0, 1, 1};
  const int n = static_cast<int>(seq_lens.size());
  std::vector<float> pool = Randn(static_cast<size_t>(2 * blocks) * kKvBlockSize * row_width, rng);
  std::vector<float> q = Randn(static_cast<size_t>(n) * heads * dim, rng),
                     w = Randn(static_cast<size_t>(n) * heads, rng);
  const std::vector<bf16> pool_b = ToBf16Rounding(pool), q_b = ToBf16Rounding(q),
                          w_b = ToBf16Rounding(w);
  std::vector<int32_t> table(static_cast<size_t>(n) * blocks);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < blocks; ++j)
      table[i * blocks + j] = seq[i] * blocks + (blocks - 1 - j);  // reversed
  }
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_pool, Upload(pool_b));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_q, Upload(q_b));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_w, Upload(w_b));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_lens, Upload(seq_lens));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_table, Upload(table));
  const int max_keys = max_len / rate;
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_scores,
                             DeviceBuffer<float>::Create(static_cast<size_t>(n) * max_keys));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_sel,
                             DeviceBuffer<int32_t>::Create(static_cast<size_t>(n) * top_k));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_count, DeviceBuffer<int32_t>::Create(n));
  IndexerParams p;
  p.q = d_q.get(), p.w = d_w.get(), p.ldw = heads, p.w_scale = 0.5f, p.scale = 0.25f;
  p.num_tokens = n, p.num_heads = heads, p.head_dim = dim, p.rate = rate, p.top_k = top_k;
  p.seq_lens = d_lens.get(), p.key_cache = d_pool.get(), p.key_row_width = row_width,
  p.key_offset = offset;
  p.block_table = d_table.get(), p.max_blocks_per_seq = blocks;
  p.scores = d_scores.get(), p.max_keys = max_keys, p.selected = d_sel.get(),
  p.count = d_count.get();
  MOESH_ASSERT_OK(RunIndexer(p));
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<int32_t> sel, d_sel.ToHost());
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<int32_t> count, d_count.ToHost());
  const std::vector<std::set<int>> got = Selections(sel, count, top_k);
  for (int i = 0; i < n; ++i) {
    const int visible = seq_lens[i] / rate;
    std::vector<float> keys(static_cast<size_t>(visible) * dim), weights(heads);
    for (int e = 0; e < visible; ++e) {
      const size_t row = static_cast<size_t>(table[i * blocks + e / kKvBlockSize]) * kKvBlockSize +
                         e % kKvBlockSize;
      std::copy_n(&pool[row * row_width + offset], dim, &keys[static_cast<size_t>(e) * dim]);
    }
    for (int h = 0; h < heads; ++h) weights[h] = w[i * heads + h] * 0.5f;
    std::vector<uint8_t> mask(visible);
    cpu::DsaIndexerParams cp;
    cp.q = &q[static_cast<size_t>(i) * heads * dim], cp.num_q = 1, cp.num_heads = heads,
    cp.head_dim = dim;
    cp.k = keys.data(), cp.k_row_stride = dim, cp.num_kv = visible, cp.q_start_pos = visible - 1;
    cp.weights = weights.data(), cp.softmax_scale = 0.25f, cp.top_k = top_k, cp.mask = mask.data();
    cpu::RunDsaIndexer(cp);
    std::set<int> want;
    for (int j = 0; j < visible; ++j) {
      if (mask[j]) want.insert(j);
    }
    EXPECT_EQ(count[i], std::min(top_k, visible)) << "query " << i;
    EXPECT_EQ(got[i], want) << "query " << i;
  }
}

TEST(IndexKeyTest, LayerNormAndRotateHalfAsTheCpu) {
  MOESH_REQUIRE_GPU();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int t = 7, dim = 128, rope = 64, ld = 200, row_width = 704, offset = 576,
            slots = 3 * kKvBlockSize;
  std::vector<float> src = Randn(static_cast<size_t>(t) * ld, rng, 2.0f, 0.5f);
  const std::vector<bf16> src_b = ToBf16Rounding(src);
  const std::vector<float> weight = Randn(dim, rng, 0.1f, 1.0f), bias = Randn(dim, rng, 0.1f);
  const std::vector<int32_t> positions = {0, 1, 17, 300, 4095, 5, 6};
  const std::vector<int32_t> slot = {3, 70, -1, 0, 191, 64, 130};  // -1: a padding row
  const cpu::RopeTable table = cpu::DefaultRopeTable(10000.0, rope);
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_src, Upload(src_b));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_w, Upload(weight));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_b, Upload(bias));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_pos, Upload(positions));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_slot, Upload(slot));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_freq, Upload(table.inv_freq));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_cache,
                             DeviceBuffer<bf16>::Create(static_cast<size_t>(slots) * row_width));
  MOESH_ASSERT_OK(testing::Poison(d_cache));
  IndexKeyParams p;
  p.src = d_src.get(), p.ld_src = ld, p.num_tokens = t, p.dim = dim, p.weight = d_w.get(),
  p.bias = d_b.get();
  p.positions = d_pos.get(), p.slot_mapping = d_slot.get(), p.cache = d_cache.get();
  p.row_width = row_width, p.offset = offset;
  p.rope.inv_freq = d_freq.get(), p.rope.dim = rope, p.rope.layout = RopeLayout::kHalves;
  MOESH_ASSERT_OK(RunIndexKey(p));
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<bf16> cache_b, d_cache.ToHost());
  const std::vector<float> cache = testing::ToFloats(cache_b);
  for (int i = 0; i < t; ++i) {
    if (slot[i] < 0) continue;
    std::vector<float> want(dim);
    cpu::LayerNorm(&src[static_cast<size_t>(i) * ld], weight.data(), bias.data(), want.data(), 1,
                   dim, 1e-6f);
    cpu::RopeParams rp;
    rp.x = want.data(), rp.num_rows = 1, rp.row_stride = dim, rp.offset = 0, rp.dim = rope;
    rp.position = positions[i], rp.layout = cpu::RopeLayout::kHalves, rp.table = &table;
    cpu::RunRope(rp);
    const std::vector<float> got(
        cache.begin() + static_cast<size_t>(slot[i]) * row_width + offset,
        cache.begin() + static_cast<size_t>(slot[i]) * row_width + offset + dim);
    EXPECT_LT(RelErr(got, want), 8e-3) << "token " << i;  // bf16's rounding
  }
  // The padding row's slot, and the row's other columns, untouched (still NaN).
  EXPECT_TRUE(std::isnan(cache[static_cast<size_t>(1) * row_width + offset]));
  EXPECT_TRUE(std::isnan(cache[static_cast<size_t>(3) * row_width]));
}

// The generic MLA kernel with V3.2's row index over rows wider than the
// latent + rope (the index key after them) against the dense kernel over the
// selected rows laid out one after another.
TEST(MlaRowIndexTest, EqualsDenseAttentionOverTheSelectedRows) {
  MOESH_REQUIRE_GPU();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int rank = 32, rope = 8, dim = rank + rope, stride = dim + 16, heads = 4, len = 150,
            keep = 11;
  const int blocks = (len + kKvBlockSize - 1) / kKvBlockSize;
  std::vector<float> cache = Randn(static_cast<size_t>(blocks) * kKvBlockSize * stride, rng);
  std::vector<float> q = Randn(static_cast<size_t>(2) * heads * dim, rng);  // query 1: padding
  const std::vector<bf16> cache_b = ToBf16Rounding(cache), q_b = ToBf16Rounding(q);
  std::vector<int32_t> order(len);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> index(order.begin(), order.begin() + keep);
  index.resize(2 * keep, 0);
  std::vector<int32_t> table(2 * blocks);
  std::iota(table.begin(), table.begin() + blocks, 0);
  // The dense copy: the selected rows, in the index's order, rows of dim.
  std::vector<bf16> dense(static_cast<size_t>(kKvBlockSize) * dim);
  for (int j = 0; j < keep; ++j) {
    std::copy_n(&cache_b[static_cast<size_t>(index[j]) * stride], dim,
                &dense[static_cast<size_t>(j) * dim]);
  }
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_cache, Upload(cache_b));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_dense, Upload(dense));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_q, Upload(q_b));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_index, Upload(index));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_table, Upload(table));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_lens, Upload(std::vector<int32_t>{keep, 0}));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_sparse_out,
                             DeviceBuffer<float>::Create(static_cast<size_t>(2) * heads * rank));
  MOESH_ASSERT_OK_AND_ASSIGN(auto d_dense_out,
                             DeviceBuffer<float>::Create(static_cast<size_t>(2) * heads * rank));
  MlaDecodeParams p;
  p.q = d_q.get(), p.kv_cache = d_cache.get(), p.block_table = d_table.get(),
  p.seq_lens = d_lens.get();
  p.batch = 2, p.num_heads = heads, p.kv_lora_rank = rank, p.rope_dim = rope;
  p.num_blocks = blocks, p.max_blocks_per_seq = blocks, p.max_seq_len = len, p.softmax_scale = 0.2f;
  p.out = d_sparse_out.get(), p.out_type = OutType::kFloat32;
  p.kv_row_stride = stride, p.kv_index = d_index.get(), p.kv_index_stride = keep;
  MOESH_ASSERT_OK(RunMlaAttentionGeneric(p));
  MlaDecodeParams dp = p;
  dp.kv_cache = d_dense.get(), dp.num_blocks = 1, dp.kv_row_stride = 0, dp.kv_index = nullptr;
  dp.out = d_dense_out.get();
  MOESH_ASSERT_OK(RunMlaAttentionGeneric(dp));
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> sparse, d_sparse_out.ToHost());
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> want, d_dense_out.ToHost());
  EXPECT_LT(RelErr(sparse, want), 1e-5);
  for (int i = heads * rank; i < 2 * heads * rank; ++i)
    ASSERT_EQ(sparse[i], 0.0f) << "the padding query";
  // A row stride below the row is refused.
  p.kv_row_stride = dim - 1;
  EXPECT_EQ(RunMlaAttentionGeneric(p).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moesh::cuda
