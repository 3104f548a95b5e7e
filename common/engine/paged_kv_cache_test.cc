#include "common/engine/paged_kv_cache.h"

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

}  // namespace
}  // namespace moesh
