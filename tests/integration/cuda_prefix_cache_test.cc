// The prefix cache in the CUDA backend's device pool (common/cuda_backend/
// kv_store.h, the block bookkeeping of common/engine/kv_block_allocator.h)
// against computing the prompt whole on the same GPU, on the golden
// checkpoints:
//   * a second turn whose history's full blocks come from the cache gives the
//     logits of the prompt computed whole (teacher-forced, every step), bit
//     for bit on the H200 (every kernel computes a row independently of the
//     pass's other rows); the max |Δlogprob| and greedy flips are printed too,
//     for V3 (MLA latent rows) and V3.2 (the indexer's keys in the same rows);
//   * every block comes back, cached blocks are evicted when the pool needs
//     them and a prefix is then computed whole again;
//   * the device-to-device KV handoff into a decode sequence that starts from
//     its own cache copies only the blocks past it, and continues as the
//     sender does;
//   * DeepSeek-V4 keeps the cache off (its compressed entries share the block
//     ids) and says nothing is cached.
// Skips (with a message) where no GPU is present.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/backend/backends.h"
#include "common/cuda_backend/model_test_util.h"
#include "common/engine/attention_backend.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "common/transport/kv_handoff.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using Loaded = testing::CheckedCheckpoint;
using testing::OpenChecked;

DeviceOptions Cuda(bool prefix_cache) {
  DeviceOptions o;
  o.device = "cuda";
  o.gpu_memory_utilization = 0.3;
  o.max_num_seqs = 8;
  o.prefix_cache = prefix_cache;
  return o;
}

std::vector<int32_t> Tokens(int n, int vocab, int seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 37 + seed * 101 + 11) % vocab);
  return t;
}

// How far the cached path's logits are from the whole path's: max |Δ| of
// the log-probabilities, and whether the greedy token differs where the
// whole path's top two are farther apart than `tie`.
struct Agreement {
  double max_dlogprob = 0;
  int flips = 0;
};
void Compare(const std::vector<float>& got, const std::vector<float>& want, int vocab, double tie,
             Agreement* a) {
  const std::vector<double> g = testing::LogSoftmax(got.data(), vocab);
  const std::vector<double> w = testing::LogSoftmax(want.data(), vocab);
  a->max_dlogprob = std::max(a->max_dlogprob, testing::MaxDiff(g, w));
  const int gi = static_cast<int>(std::max_element(g.begin(), g.end()) - g.begin());
  const int wi = static_cast<int>(std::max_element(w.begin(), w.end()) - w.begin());
  std::vector<double> sorted = w;
  std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<double>());
  if (gi != wi && sorted[0] - sorted[1] > tie) ++a->flips;
}

class CudaPrefixCacheTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Goldens, CudaPrefixCacheTest, ::testing::Values("v3", "v32"));

TEST_P(CudaPrefixCacheTest, CachedHistoryGivesTheLogitsOfTheWholePrompt) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(testing::GoldenDir(GetParam())));
  const int vocab = m.config.vocab_size;
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> cached,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(true), true));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> plain,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(false), true));
  const int all_free = cached->kv_usage().free_blocks;
  ASSERT_EQ(cached->kv_usage().block_size, 64);

  // Turn 1 publishes its history's two full blocks (130 tokens).
  const std::vector<int32_t> history = Tokens(130, vocab, 1);
  {
    MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> s,
                               cached->NewCachedSequence(140, history));
    EXPECT_EQ(s->cached_tokens(), 0);
    SequenceInput in{history, s.get()};
    MOESH_ASSERT_OK(cached->Forward({&in, 1}, nullptr).status());
    s->PublishPrefix(history);
    MOESH_ASSERT_OK(s->status());
  }
  EXPECT_EQ(cached->prefix_cache_stats().cached_blocks, 2);
  EXPECT_EQ(cached->CachedBlockHashes(8), PrefixBlockHashes(history, 64));
  EXPECT_EQ(cached->kv_usage().free_blocks, all_free);  // cached blocks count as free

  // Turn 2: the history and more, then teacher-forced tokens one at a time.
  std::vector<int32_t> prompt = history;
  for (int32_t t : Tokens(6, vocab, 2)) prompt.push_back(t);
  const std::vector<int32_t> forced = Tokens(5, vocab, 3);
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> sc,
                             cached->NewCachedSequence(160, prompt));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> sp, plain->NewCachedSequence(160, prompt));
  ASSERT_EQ(sc->cached_tokens(), 128);
  EXPECT_EQ(sc->length(), 128);
  EXPECT_GE(sc->capacity(), 160);
  EXPECT_EQ(sp->cached_tokens(), 0);
  EXPECT_EQ(cached->prefix_cache_stats().hit_tokens, 128);
  EXPECT_EQ(plain->prefix_cache_stats().hit_tokens, 0);
  Agreement agree;
  for (int step = 0; step <= static_cast<int>(forced.size()); ++step) {
    std::vector<int32_t> tc, tp;
    if (step == 0) {
      tc.assign(prompt.begin() + sc->length(), prompt.end());  // only the uncached suffix
      tp = prompt;
    } else {
      tc = tp = {forced[step - 1]};
    }
    SequenceInput ic{tc, sc.get()}, ip{tp, sp.get()};
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> lc, cached->Forward({&ic, 1}, nullptr));
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> lp, plain->Forward({&ip, 1}, nullptr));
    ASSERT_EQ(lc.size(), lp.size());
    Compare(lc, lp, vocab, 1e-2, &agree);
    EXPECT_EQ(lc, lp) << GetParam() << " step " << step;
  }
  std::printf("%s: cached vs whole over %zu positions: max |dlogprob| %.3e, %d greedy flips\n",
              GetParam().c_str(), forced.size() + 1, agree.max_dlogprob, agree.flips);
  sc.reset(), sp.reset();
  EXPECT_EQ(cached->kv_usage().free_blocks, all_free);  // no reference leaked
  EXPECT_EQ(plain->kv_usage().free_blocks, plain->kv_usage().total_blocks);
}

TEST(CudaPrefixCacheTest, CachedBlocksAreEvictedWhenThePoolNeedsThem) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(testing::GoldenDir("v3")));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> b,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(true), true));
  const std::vector<int32_t> history = Tokens(130, m.config.vocab_size, 4);
  {
    MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> s, b->NewCachedSequence(130, history));
    SequenceInput in{history, s.get()};
    MOESH_ASSERT_OK(b->Forward({&in, 1}, nullptr).status());
    s->PublishPrefix(history);
  }
  ASSERT_EQ(b->prefix_cache_stats().cached_blocks, 2);
  // Taking every block reclaims the cached ones, least recently used first.
  const KvUsage u = b->kv_usage();
  std::vector<std::unique_ptr<KvSequence>> held;
  for (int i = 0; i < u.total_blocks; ++i) {
    MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> s, b->NewSequence(64));
    held.push_back(std::move(s));
  }
  EXPECT_EQ(b->NewSequence(64).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(b->prefix_cache_stats().evictions, 2);
  EXPECT_EQ(b->prefix_cache_stats().cached_blocks, 0);
  held.clear();
  EXPECT_EQ(b->kv_usage().free_blocks, u.total_blocks);
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> again, b->NewCachedSequence(140, history));
  EXPECT_EQ(again->cached_tokens(), 0);  // computed whole again
}

// The decode side's sequence starts with two cached blocks of the prompt;
// the prefill side's blocks past them come device to device, and the
// sequence continues as the prefill side's does.
TEST(CudaPrefixCacheTest, DeviceHandoffCopiesOnlyTheBlocksPastTheCachedOnes) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(testing::GoldenDir("v3")));
  const int layers = m.config.num_hidden_layers, vocab = m.config.vocab_size;
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> prefill,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(false), true));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> decode,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(true), true));
  std::vector<int32_t> prompt = Tokens(150, vocab, 5);
  const std::vector<int32_t> history(prompt.begin(), prompt.begin() + 130);
  {  // the decode worker served the history before
    MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> s,
                               decode->NewCachedSequence(130, history));
    SequenceInput in{history, s.get()};
    MOESH_ASSERT_OK(decode->Forward({&in, 1}, nullptr).status());
    s->PublishPrefix(history);
  }
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> here, prefill->NewSequence(160));
  SequenceInput in{prompt, here.get()};
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> first, prefill->Forward({&in, 1}, nullptr));
  MOESH_ASSERT_OK_AND_ASSIGN(const KvTransfer msg,
                             SerializeKv("r", *here, layers, KvHandoff::kDevice));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> there,
                             decode->NewCachedSequence(160, prompt));
  ASSERT_EQ(there->cached_tokens(), 128);
  MOESH_ASSERT_OK(DeserializeKv(msg, layers, there.get()));
  ASSERT_EQ(there->length(), 150);
  // Rows past the cached ones are the sender's bytes; the cached ones its own.
  std::vector<float> s1, s2;
  for (int l = 0; l < layers; ++l) {
    const float* a = here->Rows(l, &s1);
    const float* b = there->Rows(l, &s2);
    const size_t w = here->row_width();
    EXPECT_TRUE(std::equal(a + 128 * w, a + 150 * w, b + 128 * w)) << "layer " << l;
  }
  Agreement agree;
  std::vector<int32_t> t = {
      static_cast<int32_t>(std::max_element(first.begin(), first.end()) - first.begin())};
  for (int step = 0; step < 4; ++step) {
    SequenceInput a{t, here.get()}, b{t, there.get()};
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> la, prefill->Forward({&a, 1}, nullptr));
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> lb, decode->Forward({&b, 1}, nullptr));
    Compare(lb, la, vocab, 1e-2, &agree);
    EXPECT_EQ(la, lb) << "step " << step;
    t = {static_cast<int32_t>(std::max_element(la.begin(), la.end()) - la.begin())};
  }
  std::printf("handoff into a cached sequence vs the sender: max |dlogprob| %.3e, %d flips\n",
              agree.max_dlogprob, agree.flips);
}

TEST(CudaPrefixCacheTest, V4KeepsTheCacheOff) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(testing::GoldenDir("v4")));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> b,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(true), true));
  const std::vector<int32_t> history = Tokens(100, m.config.vocab_size, 6);  // of 128 at most
  for (int turn = 0; turn < 2; ++turn) {
    MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> s, b->NewCachedSequence(110, history));
    EXPECT_EQ(s->cached_tokens(), 0) << "turn " << turn;
    SequenceInput in{history, s.get()};
    MOESH_ASSERT_OK(b->Forward({&in, 1}, nullptr).status());
    s->PublishPrefix(history);
  }
  EXPECT_EQ(b->prefix_cache_stats().cached_blocks, 0);
  EXPECT_EQ(b->prefix_cache_stats().hit_tokens, 0);
}

}  // namespace
}  // namespace moesh::cuda
