// DeepSeek-V3.2's sparse attention in the engine: the indexer keys live in the
// KV cache rows, so every cache (contiguous, paged, handed off between
// workers) serves it unchanged, and the sparse selection really restricts the
// attention once a sequence outgrows index_topk.
#include <algorithm>
#include <cmath>
#include <random>

#include "common/engine/paged_kv_cache.h"
#include "common/file_util.h"
#include "common/model/model.h"
#include "common/model/random_checkpoint.h"
#include "common/model/model_test_util.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

using testing_util::MaxAbsDiff;

std::unique_ptr<Model> LoadV32(int index_topk) {
  absl::StatusOr<ModelConfig> c = PresetConfig("v3.2", "tiny");
  EXPECT_TRUE(c.ok());
  c->index_topk = index_topk;
  const std::string dir = JoinPath(::testing::TempDir(), "sparse_attention_topk" + std::to_string(index_topk));
  RandomCheckpointOptions opt;
  opt.seed = 3;  // the same weights whatever index_topk is
  EXPECT_TRUE(WriteRandomCheckpoint(*c, dir, opt).ok());
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

std::vector<int32_t> Tokens(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, 511);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = d(rng);
  return t;
}

std::vector<float> Forward(const Model& m, const std::vector<int32_t>& tokens, KvSequence* cache,
                           LogitsFor which = LogitsFor::kLastToken) {
  SequenceInput in{tokens, cache};
  absl::StatusOr<std::vector<float>> l = m.Forward(absl::MakeConstSpan(&in, 1), which);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? *l : std::vector<float>();
}


TEST(SparseAttentionTest, CacheRowsCarryTheIndexerKeys) {
  std::unique_ptr<Model> m = LoadV32(8);
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  EXPECT_EQ(m->attention().kv_row_width(), c.kv_lora_rank + c.qk_rope_head_dim + c.index_head_dim);
}

TEST(SparseAttentionTest, SelectionRestrictsAttentionPastIndexTopk) {
  const int topk = 8;
  std::unique_ptr<Model> sparse = LoadV32(topk);
  std::unique_ptr<Model> dense = LoadV32(1 << 20);
  ASSERT_TRUE(sparse && dense);
  const int vocab = sparse->config().vocab_size;
  const std::vector<int32_t> tokens = Tokens(30, 7);
  SequenceKvCache a = sparse->NewCache(), b = dense->NewCache();
  const std::vector<float> ls = Forward(*sparse, tokens, &a, LogitsFor::kAllTokens);
  const std::vector<float> ld = Forward(*dense, tokens, &b, LogitsFor::kAllTokens);
  ASSERT_EQ(ls.size(), ld.size());
  float later = 0.0f;
  for (int t = 0; t < static_cast<int>(tokens.size()); ++t) {
    const float d = MaxAbsDiff(&ls[t * vocab], &ld[t * vocab], vocab);
    if (t < topk) {
      // Equal up to the rounding of expert GEMMs whose row counts differ.
      EXPECT_LE(d, 1e-5f) << "position " << t << " sees at most index_topk tokens";
    } else {
      later = std::max(later, d);
    }
  }
  EXPECT_GT(later, 1e-3f) << "the selection never changed the output";
}

TEST(SparseAttentionTest, PagedCacheAndHandoffEqualContiguous) {
  std::unique_ptr<Model> m = LoadV32(8);
  ASSERT_NE(m, nullptr);
  const ModelConfig& c = m->config();
  const std::vector<int32_t> prompt = Tokens(21, 11);
  // The prefill worker's cache, handed off row by row per layer (what the KV
  // handoff serialises) into the decode worker's paged cache.
  SequenceKvCache prefill = m->NewCache();
  const std::vector<float> first = Forward(*m, prompt, &prefill);
  KvBlockPool pool(c.num_hidden_layers, m->attention().kv_row_width(), /*block_size=*/4, /*num_blocks=*/16);
  absl::StatusOr<std::unique_ptr<PagedKvSequence>> paged = pool.Allocate(40);
  ASSERT_TRUE(paged.ok());
  for (int l = 0; l < c.num_hidden_layers; ++l) (*paged)->AppendRows(l, prefill.rows(l), prefill.length());
  ASSERT_EQ((*paged)->length(), prefill.length());
  // Decoding on either cache gives the same logits, equal to recomputation.
  std::vector<int32_t> all = prompt;
  int32_t next = static_cast<int32_t>(std::max_element(first.begin(), first.end()) - first.begin());
  for (int step = 0; step < 12; ++step) {
    all.push_back(next);
    const std::vector<float> on_paged = Forward(*m, {next}, paged->get());
    const std::vector<float> on_flat = Forward(*m, {next}, &prefill);
    EXPECT_EQ(on_paged, on_flat) << "step " << step;
    SequenceKvCache fresh = m->NewCache();
    const std::vector<float> recomputed = Forward(*m, all, &fresh);
    EXPECT_LE(MaxAbsDiff(on_paged.data(), recomputed.data(), c.vocab_size), 1e-4f) << "step " << step;
    next = static_cast<int32_t>(std::max_element(on_paged.begin(), on_paged.end()) - on_paged.begin());
  }
}

}  // namespace
}  // namespace moesh
