// The FP8 KV cache (--kv_cache_dtype fp8) on the CPU engine against its
// float32 cache, teacher-forced on the golden checkpoints (transformers'
// tokens, tests/golden/NAME/golden.json): at every position the
// log-probabilities move by a bounded amount, a greedy pick changes only
// where the float32 reference's own margin is within that move, and the
// paged pool stores the same rows as an unbounded FP8 cache. Prints the
// fidelity table BENCHMARKS.md records.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "common/engine/paged_kv_cache.h"
#include "common/model/model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moesh {
namespace {

std::vector<double> LogSoftmax(const float* x, size_t n) {
  double m = -INFINITY;
  for (size_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(x[i]));
  double s = 0.0;
  for (size_t i = 0; i < n; ++i) s += std::exp(x[i] - m);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] - m - std::log(s);
  return out;
}

struct Fidelity {
  int positions = 0;
  double sum_abs_golden = 0;  // |Δ log p(golden token)| summed
  double max_abs_golden = 0;
  double max_abs_vocab = 0;    // largest |Δ| over the vocabulary at any position
  int flips = 0;               // greedy picks that differ
  double max_flip_margin = 0;  // the float32 reference's top-1 - top-2 margin at a flip
};

class KvFp8Test : public ::testing::TestWithParam<std::string> {};

TEST_P(KvFp8Test, TeacherForcedAgainstTheFloatCache) {
  const std::string dir = JoinPath(JoinPath(MOESH_SOURCE_DIR, "tests/golden"), GetParam());
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::string> text = ReadFileToString(JoinPath(dir, "golden.json"));
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json golden = nlohmann::json::parse(*text);
  const ModelConfig& c = (*model)->config();
  const int layers = c.num_hidden_layers, width = c.kv_cache_row_width();
  Fidelity f;
  for (size_t p = 0; p < golden["prompts"].size(); ++p) {
    SequenceKvCache ref(layers, width), fp8(layers, width, KvRowFormat::Fp8(c));
    std::vector<int32_t> tokens = golden["prompts"][p].get<std::vector<int32_t>>();
    const std::vector<int32_t> want = golden["output_ids"][p].get<std::vector<int32_t>>();
    for (int32_t next : want) {
      SequenceInput a{tokens, &ref}, b{tokens, &fp8};
      absl::StatusOr<std::vector<float>> la = (*model)->Forward(absl::MakeConstSpan(&a, 1));
      absl::StatusOr<std::vector<float>> lb = (*model)->Forward(absl::MakeConstSpan(&b, 1));
      ASSERT_TRUE(la.ok() && lb.ok());
      const std::vector<double> x = LogSoftmax(la->data(), la->size());
      const std::vector<double> y = LogSoftmax(lb->data(), lb->size());
      double worst = 0;
      for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
      const double d = std::fabs(x[next] - y[next]);
      const size_t ax = std::max_element(x.begin(), x.end()) - x.begin();
      const size_t ay = std::max_element(y.begin(), y.end()) - y.begin();
      ++f.positions;
      f.sum_abs_golden += d;
      f.max_abs_golden = std::max(f.max_abs_golden, d);
      f.max_abs_vocab = std::max(f.max_abs_vocab, worst);
      if (ax != ay) {
        ++f.flips;
        std::vector<double> sorted = x;
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
        const double margin = sorted[0] - sorted[1];
        f.max_flip_margin = std::max(f.max_flip_margin, margin);
        // A flip only where the reference itself is near a tie.
        EXPECT_LE(margin, 2 * worst) << "prompt " << p << " position " << f.positions;
      }
      tokens = {next};
    }
  }
  std::printf("| %s | %d | %.4f | %.4f | %.4f | %d | %.4f |\n", GetParam().c_str(), f.positions,
              f.sum_abs_golden / f.positions, f.max_abs_golden, f.max_abs_vocab, f.flips,
              f.max_flip_margin);
  EXPECT_GT(f.max_abs_vocab, 0.0) << "the FP8 rows equal the float rows: the format is not applied";
  // DeepSeek-V3.2's tiny goldens attend to their index_topk (8) selected rows
  // only: each row's rounding weighs more than over a dense prefix, and
  // their near-uniform distributions tie often (every flip is still held to
  // the reference's own margin above).
  const bool sparse = c.has_indexer();
  EXPECT_LT(f.sum_abs_golden / f.positions, sparse ? 0.1 : 0.05);
  EXPECT_LE(f.flips, f.positions / (sparse ? 3 : 8));
}

INSTANTIATE_TEST_SUITE_P(GoldenCheckpoints, KvFp8Test,
                         ::testing::Values("v2", "v2_lite", "v3", "v3_neox", "v32",
                                           "v32_dense_rope"));

// The paged pool stores what an unbounded FP8 cache stores, prefix-shared
// blocks included.
TEST(KvFp8PoolTest, PagedRowsEqualSequenceRows) {
  const int layers = 2, width = 8 + 4;
  KvRowFormat f;
  f.fp8_latent = 8;
  f.fp8_rope = 4;
  KvBlockPool pool(layers, width, /*block_size=*/4, /*num_blocks=*/8, /*prefix_cache=*/true, f);
  SequenceKvCache seq(layers, width, f);
  absl::StatusOr<std::unique_ptr<PagedKvSequence>> paged = pool.Allocate(10);
  ASSERT_TRUE(paged.ok()) << paged.status();
  std::vector<float> rows(10 * width);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = std::sin(0.37f * i) * (1 + i % 5);
  for (int l = 0; l < layers; ++l) {
    (*paged)->AppendRows(l, rows.data(), 10);
    seq.AppendRows(l, rows.data(), 10);
  }
  std::vector<float> scratch;
  bool changed = false;
  for (int l = 0; l < layers; ++l) {
    const float* got = (*paged)->Rows(l, &scratch);
    for (int i = 0; i < 10 * width; ++i) {
      EXPECT_EQ(got[i], seq.rows(l)[i]) << l << " " << i;
      changed = changed || got[i] != rows[i];
    }
  }
  EXPECT_TRUE(changed);
}

}  // namespace
}  // namespace moesh
