// DeepSeek-V3.2's sparse attention in the engine: the indexer keys live in the
// KV cache rows, so every cache (contiguous, paged, handed off between
// workers) serves it unchanged, and the sparse selection really restricts the
// attention once a sequence outgrows index_topk.
#include <algorithm>
#include <cmath>
#include <random>

#include "base/file_util.h"
#include "common/engine/paged_kv_cache.h"
#include "common/model/attention_model.h"
#include "common/model/expert_client.h"
#include "common/model/model.h"
#include "common/model/model_test_util.h"
#include "common/model/random_checkpoint.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

using testing_util::MaxAbsDiff;

std::unique_ptr<Model> LoadV32(int index_topk) {
  absl::StatusOr<ModelConfig> c = PresetConfig("v3.2", "tiny");
  EXPECT_TRUE(c.ok());
  c->indexer.topk = index_topk;
  const std::string dir =
      JoinPath(::testing::TempDir(), "sparse_attention_topk" + std::to_string(index_topk));
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
  EXPECT_EQ(m->attention().kv_row_width(),
            c.kv_lora_rank + c.qk_rope_head_dim + c.indexer.head_dim);
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

// Within index_topk tokens V3.2 is V3: the same checkpoint read as
// deepseek_v3 (its indexer weights unread) gives the same logits at every
// position that sees index_topk tokens or fewer. The CUDA model serves V3.2
// this way (its V3 attention, context capped at index_topk).
TEST(SparseAttentionTest, WithinIndexTopkIsV3) {
  const int topk = 8;
  std::unique_ptr<Model> v32 = LoadV32(topk);
  ASSERT_NE(v32, nullptr);
  ModelConfig c = v32->config();
  c.family = ModelFamily::kDeepseekV3;
  c.model_type = "deepseek_v3";
  c.indexer.topk = 0, c.indexer.n_heads = 0, c.indexer.head_dim = 0;
  ASSERT_TRUE(c.Validate("as deepseek_v3").ok());
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt =
      Checkpoint::Open(JoinPath(::testing::TempDir(), "sparse_attention_topk8"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  absl::StatusOr<std::unique_ptr<AttentionWeights>> attention = AttentionWeights::Load(c, **ckpt);
  ASSERT_TRUE(attention.ok()) << attention.status();
  absl::StatusOr<std::unique_ptr<ExpertShardWeights>> experts =
      ExpertShardWeights::Load(c, **ckpt, {});
  ASSERT_TRUE(experts.ok()) << experts.status();
  AttentionModel v3(c, std::move(*attention));
  LocalExpertClient v3_experts(std::make_unique<ExpertStage>(c, std::move(*experts)));
  EXPECT_FALSE(v3.config().has_indexer());
  const int vocab = c.vocab_size;
  const std::vector<int32_t> tokens = Tokens(topk, 5);
  SequenceKvCache a = v32->NewCache(), b = v3.NewCache();
  const std::vector<float> l32 = Forward(*v32, tokens, &a, LogitsFor::kAllTokens);
  SequenceInput in{tokens, &b};
  absl::StatusOr<std::vector<float>> l3 =
      v3.Forward(absl::MakeConstSpan(&in, 1), &v3_experts, LogitsFor::kAllTokens);
  ASSERT_TRUE(l3.ok()) << l3.status();
  ASSERT_EQ(l32.size(), l3->size());
  for (int t = 0; t < topk; ++t) {
    EXPECT_LE(MaxAbsDiff(&l32[t * vocab], &(*l3)[t * vocab], vocab), 1e-5f) << "position " << t;
  }
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
  KvBlockPool pool(c.num_hidden_layers, m->attention().kv_row_width(), /*block_size=*/4,
                   /*num_blocks=*/16);
  absl::StatusOr<std::unique_ptr<PagedKvSequence>> paged = pool.Allocate(40);
  ASSERT_TRUE(paged.ok());
  for (int l = 0; l < c.num_hidden_layers; ++l)
    (*paged)->AppendRows(l, prefill.rows(l), prefill.length());
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
    EXPECT_LE(MaxAbsDiff(on_paged.data(), recomputed.data(), c.vocab_size), 1e-4f)
        << "step " << step;
    next =
        static_cast<int32_t>(std::max_element(on_paged.begin(), on_paged.end()) - on_paged.begin());
  }
}

}  // namespace
}  // namespace moesh
