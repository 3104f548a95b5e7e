// Helpers shared by the model tests (not linked into any library code).
#ifndef MOESH_COMMON_MODEL_MODEL_TEST_UTIL_H_
#define MOESH_COMMON_MODEL_MODEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/model/model.h"
#include "gtest/gtest.h"

namespace moesh::testing_util {

// n token ids uniform in [0, vocab), reproducible from `seed`.
inline std::vector<int32_t> RandomTokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = d(rng);
  return t;
}

// max_i |a[i] - b[i]| over n floats.
inline float MaxAbsDiff(const float* a, const float* b, size_t n) {
  float worst = 0.0f;
  for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

// A fixture, parameterized by a string, over one Model: a test's SetUp calls
// LoadModel (a fatal failure when the model does not load).
class ModelFixture : public ::testing::TestWithParam<std::string> {
 protected:
  void LoadModel(const std::string& dir) {
    absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    vocab_ = model_->config().vocab_size;
  }
  // The logits (`which`) of `tokens` appended to `cache`; empty (and a
  // failure) when the forward pass fails.
  std::vector<float> Run(const std::vector<int32_t>& tokens, KvSequence* cache,
                         LogitsFor which = LogitsFor::kLastToken) {
    SequenceInput in{tokens, cache};
    absl::StatusOr<std::vector<float>> l = model_->Forward(absl::MakeConstSpan(&in, 1), which);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? *l : std::vector<float>();
  }

  std::unique_ptr<Model> model_;
  int vocab_ = 0;
};

}  // namespace moesh::testing_util

#endif  // MOESH_COMMON_MODEL_MODEL_TEST_UTIL_H_
