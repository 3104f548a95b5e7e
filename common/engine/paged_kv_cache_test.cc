#include "common/engine/paged_kv_cache.h"

#include <algorithm>
#include <random>

#include "base/file_util.h"
#include "common/model/model.h"
#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

TEST(PagedKvCacheTest, AllocatesFreesAndReportsUsage) {
  KvBlockPool pool(/*num_layers=*/2, /*row_width=*/3, /*block_size=*/4, /*num_blocks=*/5);
  EXPECT_EQ(pool.free_blocks(), 5);
  absl::StatusOr<std::unique_ptr<PagedKvSequence>> a = pool.Allocate(9);  // 3 blocks
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->capacity(), 12);
  EXPECT_EQ(pool.free_blocks(), 2);
  EXPECT_FLOAT_EQ(pool.usage(), 0.6f);
  absl::StatusOr<std::unique_ptr<PagedKvSequence>> b = pool.Allocate(9);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  a->reset();
  EXPECT_EQ(pool.free_blocks(), 5);
  EXPECT_FLOAT_EQ(pool.usage(), 0.0f);
}

TEST(PagedKvCacheTest, ReserveGrowsBlockByBlockAndFreesAll) {
  KvBlockPool pool(/*num_layers=*/2, /*row_width=*/3, /*block_size=*/4, /*num_blocks=*/4);
  absl::StatusOr<std::unique_ptr<PagedKvSequence>> a = pool.Allocate(3);  // 1 block
  ASSERT_TRUE(a.ok());
  std::vector<float> rows(16 * 3, 1.0f);
  for (int l = 0; l < 2; ++l) (*a)->AppendRows(l, rows.data(), 3);
  EXPECT_TRUE((*a)->Reserve(4).ok());  // within its block: takes none
  EXPECT_EQ(pool.free_blocks(), 3);
  EXPECT_TRUE((*a)->Reserve(5).ok());
  EXPECT_EQ((*a)->capacity(), 8);
  EXPECT_EQ(pool.free_blocks(), 2);
  absl::StatusOr<std::unique_ptr<PagedKvSequence>> b = pool.Allocate(8);  // the last 2
  ASSERT_TRUE(b.ok());
  absl::Status full = (*a)->Reserve(9);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_EQ((*a)->capacity(), 8);  // nothing taken
  b->reset();
  ASSERT_TRUE((*a)->Reserve(16).ok());
  for (int l = 0; l < 2; ++l) (*a)->AppendRows(l, rows.data(), 13);  // across new blocks
  EXPECT_EQ((*a)->length(), 16);
  EXPECT_EQ(pool.free_blocks(), 0);
  a->reset();
  EXPECT_EQ(pool.free_blocks(), 4);
}

TEST(PagedKvCacheTest, RowsSurviveBlockBoundaries) {
  KvBlockPool pool(2, 3, 4, 8);
  absl::StatusOr<std::unique_ptr<PagedKvSequence>> s = pool.Allocate(11);
  ASSERT_TRUE(s.ok());
  std::vector<float> rows(11 * 3);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i);
  for (int chunk : {5, 1, 5}) {
    const int start = (*s)->length();
    for (int l = 0; l < 2; ++l) (*s)->AppendRows(l, rows.data() + start * 3, chunk);
  }
  EXPECT_EQ((*s)->length(), 11);
  std::vector<float> scratch;
  for (int l = 0; l < 2; ++l) {
    const float* got = (*s)->Rows(l, &scratch);
    EXPECT_EQ(std::vector<float>(got, got + rows.size()), rows);
  }
}

TEST(PagedKvCacheTest, ForwardOverPagedCacheEqualsContiguous) {
  const std::string dir = JoinPath(::testing::TempDir(), "paged_kv_model");
  absl::StatusOr<ModelConfig> c = PresetConfig("v2", "tiny");
  ASSERT_TRUE(WriteRandomCheckpoint(*c, dir, {}).ok());
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  KvBlockPool pool(c->num_hidden_layers, (*m)->attention().kv_row_width(), /*block_size=*/4, 16);
  absl::StatusOr<std::unique_ptr<PagedKvSequence>> paged = pool.Allocate(30);
  ASSERT_TRUE(paged.ok());
  SequenceKvCache flat = (*m)->NewCache();
  std::vector<int32_t> prompt = {3, 9, 27, 81, 243, 200, 100};
  for (int step = 0; step < 5; ++step) {
    std::vector<int32_t> in_tokens =
        step == 0 ? prompt : std::vector<int32_t>{static_cast<int32_t>(step + 10)};
    SequenceInput a{in_tokens, paged->get()}, b{in_tokens, &flat};
    absl::StatusOr<std::vector<float>> la = (*m)->Forward(absl::MakeConstSpan(&a, 1));
    absl::StatusOr<std::vector<float>> lb = (*m)->Forward(absl::MakeConstSpan(&b, 1));
    ASSERT_TRUE(la.ok() && lb.ok());
    EXPECT_EQ(*la, *lb) << "step " << step;
  }
  // Past its capacity the forward refuses up front.
  std::vector<int32_t> too_many(30, 5);
  SequenceInput over{too_many, paged->get()};
  EXPECT_EQ((*m)->Forward(absl::MakeConstSpan(&over, 1)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// Writes `n` rows to every layer of `s`, row t of layer l all (token[t] + l).
void AppendTokenRows(PagedKvSequence* s, const std::vector<int32_t>& tokens, int n) {
  const int w = s->row_width();
  const int start = s->length();
  for (int l = 0; l < 2; ++l) {
    std::vector<float> rows(static_cast<size_t>(n) * w);
    for (int t = 0; t < n; ++t)
      std::fill_n(rows.begin() + t * w, w, static_cast<float>(tokens[start + t] + l));
    s->AppendRows(l, rows.data(), n);
  }
}

TEST(PrefixCacheTest, BlockHashesChainOverWholeBlocksAndAreStable) {
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<uint64_t> h = PrefixBlockHashes(a, 4);
  ASSERT_EQ(h.size(), 2u);  // the partial block has none
  EXPECT_NE(h[0], h[1]);
  // The second block's hash depends on the first block's tokens.
  std::vector<int32_t> b = a;
  b[0] = 100;
  std::vector<uint64_t> hb = PrefixBlockHashes(b, 4);
  EXPECT_NE(hb[0], h[0]);
  EXPECT_NE(hb[1], h[1]);
  // Same tokens, same hashes: in any process (a router computes them too).
  EXPECT_EQ(PrefixBlockHashes(a, 4), h);
  EXPECT_EQ(PrefixBlockHashes({1, 2, 3}, 4).size(), 0u);
}

TEST(PrefixCacheTest, SharesFullBlocksCountsReferencesAndFreesEverything) {
  KvBlockPool pool(/*num_layers=*/2, /*row_width=*/3, /*block_size=*/4, /*num_blocks=*/8,
                   /*prefix_cache=*/true);
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::unique_ptr<PagedKvSequence> a = *pool.Allocate(10, prompt);
  EXPECT_EQ(a->cached_tokens(), 0);  // nothing published yet
  AppendTokenRows(a.get(), prompt, 10);
  a->PublishPrefix(prompt);
  EXPECT_EQ(pool.stats().cached_blocks, 2);  // the partial third block stays private
  EXPECT_EQ(pool.free_blocks(), 5);

  // The same prompt: its two full blocks are shared, the rest is its own.
  std::unique_ptr<PagedKvSequence> b = *pool.Allocate(12, prompt);
  EXPECT_EQ(b->cached_tokens(), 8);
  EXPECT_EQ(b->length(), 8);
  EXPECT_EQ(b->block_table()[0], a->block_table()[0]);
  EXPECT_EQ(b->block_table()[1], a->block_table()[1]);
  EXPECT_NE(b->block_table()[2], a->block_table()[2]);  // never writes a shared block
  EXPECT_EQ(pool.free_blocks(), 4);
  std::vector<float> scratch;
  for (int l = 0; l < 2; ++l) {
    const float* rows = b->Rows(l, &scratch);
    for (int t = 0; t < 8; ++t) EXPECT_EQ(rows[t * 3], static_cast<float>(prompt[t] + l));
  }
  // A prompt of exactly two blocks reuses one: its last token must be computed.
  std::unique_ptr<PagedKvSequence> c = *pool.Allocate(8, {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_EQ(c->cached_tokens(), 4);
  // A different second block shares only the first.
  std::unique_ptr<PagedKvSequence> d = *pool.Allocate(10, {1, 2, 3, 4, 9, 9, 9, 9, 1, 1});
  EXPECT_EQ(d->cached_tokens(), 4);
  const PrefixCacheStats st = pool.stats();
  EXPECT_EQ(st.hit_tokens, 8 + 4 + 4);
  EXPECT_EQ(st.miss_tokens, 10 + 2 + 4 + 6);
  // Every reference dropped: all blocks reclaimable, the published ones kept.
  a.reset(), b.reset(), c.reset(), d.reset();
  EXPECT_EQ(pool.free_blocks(), 8);
  EXPECT_FLOAT_EQ(pool.usage(), 0.0f);
  EXPECT_EQ(pool.stats().cached_blocks, 2);
  std::unique_ptr<PagedKvSequence> e = *pool.Allocate(10, prompt);
  EXPECT_EQ(e->cached_tokens(), 8);  // still cached after its writers ended
}

TEST(PrefixCacheTest, EvictsLeastRecentlyUsedCachedBlocksOnlyWhenThePoolNeedsThem) {
  KvBlockPool pool(2, 3, 4, /*num_blocks=*/4, /*prefix_cache=*/true);
  const std::vector<int32_t> p1 = {1, 1, 1, 1, 2, 2, 2, 2, 0};
  const std::vector<int32_t> p2 = {3, 3, 3, 3, 0};
  for (const std::vector<int32_t>* p : {&p1, &p2}) {
    std::unique_ptr<PagedKvSequence> s = *pool.Allocate(static_cast<int>(p->size()), *p);
    AppendTokenRows(s.get(), *p, static_cast<int>(p->size()));
    s->PublishPrefix(*p);
  }
  EXPECT_EQ(pool.stats().cached_blocks, 3);  // p1's two, then p2's one
  EXPECT_EQ(pool.free_blocks(), 4);
  // One block needed: the plain free one goes first, nothing evicted.
  std::unique_ptr<PagedKvSequence> x = *pool.Allocate(4);
  EXPECT_EQ(pool.stats().evictions, 0);
  // Two more: the least recently used cached blocks (p1's) go.
  std::unique_ptr<PagedKvSequence> y = *pool.Allocate(8);
  EXPECT_EQ(pool.stats().evictions, 2);
  EXPECT_EQ(pool.stats().cached_blocks, 1);
  x.reset();
  std::unique_ptr<PagedKvSequence> z = *pool.Allocate(5, p2);  // p2's block survived
  EXPECT_EQ(z->cached_tokens(), 4);
  y.reset(), z.reset();
  EXPECT_EQ((*pool.Allocate(9, p1))->cached_tokens(), 0);  // p1's were evicted
  EXPECT_EQ(pool.free_blocks(), 4);
}

TEST(PrefixCacheTest, AnEvictedPrefixLosesItsTailBeforeItsHead) {
  KvBlockPool pool(2, 3, 4, /*num_blocks=*/3, /*prefix_cache=*/true);
  const std::vector<int32_t> p = {1, 1, 1, 1, 2, 2, 2, 2, 0};
  std::unique_ptr<PagedKvSequence> s = *pool.Allocate(9, p);
  AppendTokenRows(s.get(), p, 9);
  s->PublishPrefix(p);
  s.reset();
  // Two blocks needed: the plain free one, then one cached: the tail.
  std::unique_ptr<PagedKvSequence> x = *pool.Allocate(8);
  EXPECT_EQ(pool.stats().evictions, 1);
  x.reset();
  EXPECT_EQ((*pool.Allocate(9, p))->cached_tokens(), 4);  // the head still serves
}

TEST(PrefixCacheTest, HeldCachedBlocksAreNeverEvictedAndAFailedAllocationHoldsNothing) {
  KvBlockPool pool(2, 3, 4, /*num_blocks=*/3, /*prefix_cache=*/true);
  const std::vector<int32_t> p = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::unique_ptr<PagedKvSequence> a = *pool.Allocate(9, p);
  AppendTokenRows(a.get(), p, 9);
  a->PublishPrefix(p);
  a.reset();
  std::unique_ptr<PagedKvSequence> b = *pool.Allocate(9, p);  // holds the two cached blocks
  EXPECT_EQ(b->cached_tokens(), 8);
  EXPECT_EQ(pool.free_blocks(), 0);
  EXPECT_EQ(pool.Allocate(1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.stats().evictions, 0);
  b.reset();
  // Needing all three: the cached prefix is matched, then the pool has one
  // block short of the new sequence's 4 (16 tokens): refused, nothing held.
  EXPECT_EQ(pool.Allocate(16, p).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.free_blocks(), 3);
  EXPECT_EQ(pool.stats().cached_blocks, 2);
}

TEST(PrefixCacheTest, OffPublishesNothing) {
  KvBlockPool pool(2, 3, 4, 4);
  const std::vector<int32_t> p = {1, 2, 3, 4, 5};
  std::unique_ptr<PagedKvSequence> a = *pool.Allocate(5, p);
  AppendTokenRows(a.get(), p, 5);
  a->PublishPrefix(p);
  EXPECT_EQ((*pool.Allocate(5, p))->cached_tokens(), 0);
  EXPECT_EQ(pool.stats().cached_blocks, 0);
  EXPECT_EQ(pool.stats().hit_tokens + pool.stats().miss_tokens, 0);
}

}  // namespace
}  // namespace moesh
