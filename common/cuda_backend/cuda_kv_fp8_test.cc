// The FP8 KV cache (CudaModelOptions::fp8_kv_cache, --kv_cache_dtype fp8) on
// the GPU against the CPU engine with its FP8 cache (KvRowFormat::Fp8, the
// reference: kernels/cpu/fp8.h), teacher-forced, next to the bf16 cache
// against the CPU's float32 one in the same run:
//   * at DeepSeek's real attention widths (latent 512, rope 64: the tuned
//     16-head decode kernel reading FP8 rows; V3.2's selection gathered and
//     widened) and at a tiny model's (32 + 8: the generic kernel), on random
//     bf16 checkpoints of V2-Lite, V3 and V3.2;
//   * rows in and out through the host (the KV handoff's host path): what
//     comes back is cpu::RoundTripFp8KvRow of what went in, exactly;
//   * the device-to-device handoff between two FP8 pools, and its refusal
//     between an FP8 and a bf16 pool.
// Skips where no GPU is present.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "common/cuda_backend/cuda_model.h"
#include "common/cuda_backend/fidelity_test_util.h"
#include "common/cuda_backend/model_test_util.h"
#include "common/model/kv_cache.h"
#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::Compare;
using testing::CpuEngine;
using testing::Fidelity;
using testing::LoadCpu;

// The GPU's bf16 activations put some latent values on the other side of an
// e4m3 rounding boundary from the CPU's float32 ones: a code one step off
// (1/16 relative) in places, so the two FP8 caches differ by about what FP8
// itself moves (the CPU engine's FP8 cache against its float one: max
// |dlogprob| 0.49 on the v3 golden). Measured on the H100/H200: 0.049 to 0.067
// of the logits' spread at real widths (v2-lite, v3, v3.2); at the tiny widths
// (a 32-wide latent, flat distributions with little spread, a fresh seed each
// run) 0.02 to 0.57 (tiny v3 0.41, tiny v3.2 0.56: 2026-12-06). A wrong
// layout, scale or row moves the logits by their whole spread (>= 1).
constexpr double kFp8KvRelTolerance = 0.2;
constexpr double kFp8KvRelToleranceTiny = 0.8;
constexpr double kBf16RelTolerance = testing::kBf16RelLogitTolerance;

// DeepSeek-V3.2 with every causal row selected (index_topk above the
// prompts' lengths): its FP8 rows carry the index key after the rope part and
// its sparse attention reads them through the selection (the gathered copy,
// widened, at real widths; the generic kernel at tiny ones), while the GPU's
// bf16 index keys against the CPU's float32 ones cannot flip a selection.
ModelConfig Widths(const std::string& family, bool real) {
  ModelConfig c;
  if (real) {
    c = testing::RealWidths(family);
  } else {
    absl::StatusOr<ModelConfig> tiny = PresetConfig(family, "tiny");
    EXPECT_TRUE(tiny.ok()) << tiny.status();
    c = *tiny;
    // Every token to every expert (as RealWidths): a router near-tie
    // flipped by bf16 rounding moved one position by ~1 nat (tiny v3.2, a
    // fresh seed, H100, 2026-12-06: rel 0.84 with the bf16 cache too).
    c.num_experts_per_tok = c.n_routed_experts;
    c.topk_group = c.n_group;
  }
  if (c.has_indexer()) c.indexer.topk = 256;
  return c;
}

std::string WriteCheckpoint(const ModelConfig& c, const std::string& name, uint64_t seed) {
  const std::string dir = JoinPath(::testing::TempDir(), name);
  RandomCheckpointOptions ro;
  ro.seed = seed;
  EXPECT_TRUE(WriteRandomCheckpoint(c, dir, ro).ok());
  return dir;
}

CudaModelOptions Options(bool fp8) {
  CudaModelOptions o = testing::SmallModelOptions();
  o.fp8_kv_cache = fp8;
  return o;
}

struct KvCase {
  const char* family;
  bool real_widths;
};

class CudaKvFp8Test : public ::testing::TestWithParam<KvCase> {};

TEST_P(CudaKvFp8Test, MatchesTheCpuEnginesFp8Cache) {
  MOESH_REQUIRE_GPU();
  const KvCase k = GetParam();
  const ModelConfig c = Widths(k.family, k.real_widths);
  const uint64_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message()
               << k.family << " real widths " << k.real_widths << " seed " << seed);
  const std::string dir = WriteCheckpoint(
      c, absl::StrCat("kv_fp8_", k.family, k.real_widths ? "_real" : "_tiny"), seed);
  absl::StatusOr<CpuEngine> cpu = LoadCpu(dir);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  absl::StatusOr<std::unique_ptr<CudaModel>> fp8 = CudaModel::Load(dir, Options(true));
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  absl::StatusOr<std::unique_ptr<CudaModel>> bf16 = CudaModel::Load(dir, Options(false));
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  ASSERT_TRUE((*fp8)->kv_row_spec().fp8());
  EXPECT_LT(KvPool::BlockBytes(c.num_hidden_layers, (*fp8)->kv_row_spec()),
            KvPool::BlockBytes(c.num_hidden_layers, (*bf16)->kv_row_spec()));

  std::vector<Fidelity> on_fp8, on_float;
  Compare(c, *cpu, {fp8->get()}, &on_fp8, static_cast<uint32_t>(seed), KvRowFormat::Fp8(c));
  Compare(c, *cpu, {bf16->get()}, &on_float, static_cast<uint32_t>(seed));
  std::printf("%s (%s widths), teacher-forced against the CPU engine:\n", k.family,
              k.real_widths ? "real" : "tiny");
  on_fp8[0].Print("GPU FP8 KV vs CPU FP8 KV:");
  on_float[0].Print("GPU bf16 KV vs CPU float KV:");
  EXPECT_LE(on_fp8[0].worst_rel, k.real_widths ? kFp8KvRelTolerance : kFp8KvRelToleranceTiny);
  EXPECT_LE(on_float[0].worst_rel, kBf16RelTolerance);
}

INSTANTIATE_TEST_SUITE_P(Families, CudaKvFp8Test,
                         ::testing::Values(KvCase{"v2-lite", true}, KvCase{"v3", true},
                                           KvCase{"v3.2", true}, KvCase{"v2-lite", false},
                                           KvCase{"v3", false}, KvCase{"v3.2", false}),
                         [](const ::testing::TestParamInfo<KvCase>& info) {
                           std::string name = info.param.family;
                           name.erase(
                               std::remove_if(name.begin(), name.end(),
                                              [](char ch) { return ch == '-' || ch == '.'; }),
                               name.end());
                           return name + (info.param.real_widths ? "Real" : "Tiny");
                         });

// DeepSeek-V3.2 selecting (index_topk below the prompt): the FP8 pool's index
// keys sit where the bf16 pool's values are, bit for bit (layer 0: the same
// inputs), and its indexer reads them there — the FP8 model's logits differ
// from the bf16 model's at positions that select about as much as at those
// that attend to every row (FP8 rounding alone), where a key read from the
// wrong bytes would select other rows.
TEST(CudaKvFp8V32Test, TheIndexerReadsItsKeysFromFp8Rows) {
  MOESH_REQUIRE_GPU();
  ModelConfig c = testing::RealWidths("v3.2");
  const int n = 200;
  c.indexer.topk = 48;
  const std::string dir = WriteCheckpoint(c, "kv_fp8_v32_select", 11);
  absl::StatusOr<std::unique_ptr<CudaModel>> fp8 = CudaModel::Load(dir, Options(true));
  absl::StatusOr<std::unique_ptr<CudaModel>> bf16 = CudaModel::Load(dir, Options(false));
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  std::vector<int32_t> tokens;
  for (int t = 0; t < n; ++t) tokens.push_back(2 + (t * 53) % (c.vocab_size - 2));
  std::vector<float> logits[2], rows[2];
  CudaModel* models[2] = {fp8->get(), bf16->get()};
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<int> seq = models[i]->AddSequence();
    ASSERT_TRUE(seq.ok()) << seq.status();
    const std::vector<SequenceTokens> prompt = {{*seq, tokens}};
    absl::StatusOr<std::vector<float>> l = models[i]->ForwardAllLogits(prompt);
    ASSERT_TRUE(l.ok()) << l.status();
    logits[i] = std::move(*l);
    absl::StatusOr<std::vector<float>> r = models[i]->ReadKvRows(*seq, 0, n);
    ASSERT_TRUE(r.ok()) << r.status();
    rows[i] = std::move(*r);
  }
  const int width = c.kv_cache_row_width(), key = c.kv_lora_rank + c.qk_rope_head_dim;
  for (int t = 0; t < n; ++t) {
    for (int d = key; d < width; ++d) {
      const size_t i = static_cast<size_t>(t) * width + d;
      ASSERT_EQ(rows[0][i], rows[1][i]) << "layer 0 index key, token " << t << " dim " << d - key;
    }
  }
  // Per position: max |FP8 - bf16| over the vocabulary against the bf16
  // logits' spread there; the largest among the dense and the selecting ones.
  const size_t v = c.vocab_size;
  double dense = 0, sparse = 0;
  for (int t = 0; t < n; ++t) {
    double diff = 0, lo = 1e30, hi = -1e30;
    for (size_t j = 0; j < v; ++j) {
      const float a = logits[0][t * v + j], b = logits[1][t * v + j];
      diff = std::max(diff, static_cast<double>(std::fabs(a - b)));
      lo = std::min(lo, static_cast<double>(b)), hi = std::max(hi, static_cast<double>(b));
    }
    double& worst = t < c.indexer.topk ? dense : sparse;
    worst = std::max(worst, diff / std::max(hi - lo, 1e-6));
  }
  std::printf(
      "v3.2 FP8 against bf16 KV on the GPU: worst rel %.4f attending to every row, %.4f "
      "selecting %d of up to %d\n",
      dense, sparse, c.indexer.topk, n);
  EXPECT_GT(dense, 0.0) << "FP8 rows read back as bf16: the format is not applied";
  // Selection flips between the two caches move the selecting positions more
  // (H100: 0.19 at dense 0.06 in one run, under 0.18 in the run before on the
  // same inputs: the selected rows land in atomics order, so attention sums
  // them in an order that varies run to run); a key read from the wrong
  // bytes selects unrelated rows, an error of the logits' own spread.
  EXPECT_LE(sparse, std::max(0.3, 4 * dense));
}

// Host rows in, host rows out: cpu::RoundTripFp8KvRow of what went in, bit
// for bit (rows handed over as floats and stored again are unchanged).
TEST(CudaKvFp8HandoffTest, HostRowsComeBackAsTheCpuCacheHoldsThem) {
  MOESH_REQUIRE_GPU();
  const ModelConfig c = testing::RealWidths("v3");
  const std::string dir = WriteCheckpoint(c, "kv_fp8_rows", 3);
  absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Load(dir, Options(true));
  ASSERT_TRUE(m.ok()) << m.status();
  const int width = (*m)->kv_row_width(), n = 150;
  std::mt19937 rng(testing::FreshSeed());
  std::normal_distribution<float> d(0.0f, 2.0f);
  absl::StatusOr<int> seq = (*m)->AddSequence();
  ASSERT_TRUE(seq.ok()) << seq.status();
  std::vector<std::vector<float>> sent(c.num_hidden_layers);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    sent[l].resize(static_cast<size_t>(n) * width);
    for (float& v : sent[l]) v = d(rng);
    ASSERT_TRUE((*m)->AppendKvRows(*seq, l, sent[l].data(), n).ok());
  }
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    absl::StatusOr<std::vector<float>> back = (*m)->ReadKvRows(*seq, l, n);
    ASSERT_TRUE(back.ok()) << back.status();
    std::vector<float> want = sent[l];
    KvRowFormat::Fp8(c).Apply(want.data(), n, width);
    EXPECT_EQ(std::memcmp(back->data(), want.data(), want.size() * sizeof(float)), 0)
        << "layer " << l;
  }
}

// Device to device (cuda_ipc's path within one process): an FP8 pool's
// blocks arrive in another FP8 pool whole; a bf16 pool refuses them.
TEST(CudaKvFp8HandoffTest, DeviceBlocksMoveBetweenFp8PoolsOnly) {
  MOESH_REQUIRE_GPU();
  const ModelConfig c = testing::RealWidths("v2-lite");
  const std::string dir = WriteCheckpoint(c, "kv_fp8_blocks", 4);
  absl::StatusOr<std::unique_ptr<CudaModel>> a = CudaModel::Load(dir, Options(true));
  absl::StatusOr<std::unique_ptr<CudaModel>> b = CudaModel::Load(dir, Options(true));
  absl::StatusOr<std::unique_ptr<CudaModel>> f = CudaModel::Load(dir, Options(false));
  ASSERT_TRUE(a.ok() && b.ok() && f.ok());
  const int n = 100;
  absl::StatusOr<int> sa = (*a)->AddSequence();
  ASSERT_TRUE(sa.ok());
  std::vector<int32_t> tokens;
  for (int t = 0; t < n; ++t) tokens.push_back(2 + (t * 37) % (c.vocab_size - 2));
  const std::vector<SequenceTokens> prompt = {{*sa, tokens}};
  ASSERT_TRUE((*a)->ForwardLogits(prompt).ok());
  absl::StatusOr<DeviceKvBlocks> blocks = (*a)->ExportKv(*sa);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  const cpu::Fp8KvRowLayout layout{c.kv_lora_rank, c.qk_rope_head_dim};
  EXPECT_EQ(blocks->row_bytes, layout.bytes());

  absl::StatusOr<int> sb = (*b)->AddSequence();
  ASSERT_TRUE(sb.ok());
  ASSERT_TRUE((*b)->ImportKv(*sb, *blocks, n).ok());
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    absl::StatusOr<std::vector<float>> ra = (*a)->ReadKvRows(*sa, l, n);
    absl::StatusOr<std::vector<float>> rb = (*b)->ReadKvRows(*sb, l, n);
    ASSERT_TRUE(ra.ok() && rb.ok());
    EXPECT_EQ(*ra, *rb) << "layer " << l;
  }
  absl::StatusOr<int> sf = (*f)->AddSequence();
  ASSERT_TRUE(sf.ok());
  const absl::Status refused = (*f)->ImportKv(*sf, *blocks, n);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("--kv_cache_dtype"), std::string::npos) << refused;
}

// What the FP8 cache covers: refused for V4 (its compressed entries).
TEST(CudaKvFp8HandoffTest, RefusesDeepSeekV4) {
  MOESH_REQUIRE_GPU();
  absl::StatusOr<ModelConfig> c = PresetConfig("v4", "tiny");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string dir = WriteCheckpoint(*c, "kv_fp8_v4", 5);
  absl::StatusOr<std::unique_ptr<CudaModel>> m = CudaModel::Load(dir, Options(true));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnimplemented) << m.status();
}

}  // namespace
}  // namespace moesh::cuda
