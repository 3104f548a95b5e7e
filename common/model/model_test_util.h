// Helpers shared by the model tests (not linked into any library code).
#ifndef MOESH_COMMON_MODEL_MODEL_TEST_UTIL_H_
#define MOESH_COMMON_MODEL_MODEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/model/expert_client.h"
#include "common/model/model.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
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

// Two shards of the experts, summed, as two expert workers would serve them.
class TwoShardClient : public ExpertClient {
 public:
  TwoShardClient(std::unique_ptr<ExpertStage> a, std::unique_ptr<ExpertStage> b)
      : a_(std::move(a)), b_(std::move(b)) {}
  absl::Status Run(const MoeDispatch& d, float* out) override {
    std::fill(out, out + static_cast<size_t>(d.num_tokens) * d.hidden, 0.0f);
    if (absl::Status s = a_->Accumulate(d, out); !s.ok()) return s;
    return b_->Accumulate(d, out);
  }

 private:
  std::unique_ptr<ExpertStage> a_, b_;
};

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

  // The loaded model (from checkpoint `dir`) with its experts in two shards,
  // even and odd ids (each loading only its own), gives the logits of all the
  // experts in one place, to 1e-5, for `num_tokens` random tokens.
  void ExpectShardedExpertsEqualLocal(const std::string& dir, int num_tokens) {
    absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    const ModelConfig& c = model_->config();
    std::set<int> even, odd;
    for (int e = 0; e < c.n_routed_experts; ++e) (e % 2 ? odd : even).insert(e);
    auto load = [&](const std::set<int>& ids) {
      absl::StatusOr<std::unique_ptr<ExpertShardWeights>> w =
          ExpertShardWeights::Load(c, **ckpt, ids);
      EXPECT_TRUE(w.ok()) << w.status();
      EXPECT_EQ((*w)->layers.begin()->second.size(), ids.size());  // only the shard's experts
      return std::make_unique<ExpertStage>(c, std::move(*w));
    };
    TwoShardClient sharded(load(even), load(odd));
    const std::vector<int32_t> tokens = RandomTokens(num_tokens, vocab_, 8);
    SequenceKvCache c1 = model_->NewCache(), c2 = model_->NewCache();
    SequenceInput in1{tokens, &c1}, in2{tokens, &c2};
    absl::StatusOr<std::vector<float>> local = model_->Forward(absl::MakeConstSpan(&in1, 1));
    absl::StatusOr<std::vector<float>> split =
        model_->attention().Forward(absl::MakeConstSpan(&in2, 1), &sharded);
    ASSERT_TRUE(local.ok() && split.ok());
    EXPECT_LE(MaxAbsDiff(local->data(), split->data(), vocab_), 1e-5f);
  }

  std::unique_ptr<Model> model_;
  int vocab_ = 0;
};

}  // namespace moesh::testing_util

#endif  // MOESH_COMMON_MODEL_MODEL_TEST_UTIL_H_
