// Log-probabilities and sibling choices through real clusters (router,
// prefill, decode and expert workers as processes; and a colocated router):
// each generated token's own log-probability and the prompt's equal
// log_softmax of the model's logits computed here by teacher forcing; n
// siblings are distinct, reproducible, and each equals the single-process
// run with its derived seed; n over the limit is INVALID_ARGUMENT.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/engine/generate.h"
#include "common/model/attention_model.h"
#include "common/model/model.h"
#include "gtest/gtest.h"
#include "moesh/v1/generation.grpc.pb.h"
#include "tests/integration/cluster_harness.h"

namespace moesh {
namespace {

// log_softmax of the model's logits after each prefix of `tokens`: row t
// holds log p(. | tokens[0..t]), from one teacher-forced pass over them all.
std::vector<std::vector<double>> TeacherForced(const Model& model,
                                               const std::vector<int32_t>& tokens) {
  const int vocab = model.config().vocab_size;
  SequenceKvCache cache = model.NewCache();
  SequenceInput in{tokens, &cache};
  absl::StatusOr<std::vector<float>> logits =
      model.attention().Forward({&in, 1}, model.experts(), LogitsFor::kAllTokens);
  EXPECT_TRUE(logits.ok()) << logits.status();
  std::vector<std::vector<double>> rows;
  for (size_t t = 0; t < tokens.size() && logits.ok(); ++t) {
    const float* x = logits->data() + t * vocab;
    const double mx = *std::max_element(x, x + vocab);
    double sum = 0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
    std::vector<double> row(vocab);
    for (int i = 0; i < vocab; ++i) row[i] = x[i] - mx - std::log(sum);
    rows.push_back(std::move(row));
  }
  return rows;
}

// A sampled request with the token's own and the prompt's log-probabilities.
v1::GenerateRequest LogprobRequest(const std::vector<int32_t>& prompt, int max_new, uint64_t seed) {
  v1::GenerateRequest r = Request(prompt, max_new, 0.9f, seed);
  r.mutable_sampling()->set_repetition_penalty(1.3f);  // the draw's distribution is not the raw one
  r.mutable_sampling()->set_logprobs(true);
  r.mutable_sampling()->set_prompt_logprobs(2);
  return r;
}

void ExpectLogprobsOfTheModel(const std::string& router, const Model& model) {
  const std::vector<int32_t> prompt = {11, 5, 42, 7, 19, 3};
  Result r = Call(router, LogprobRequest(prompt, 8, 21));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.ids.size(), 8u);
  ASSERT_EQ(r.token_logprobs.size(), r.ids.size());  // the prefill worker's first one included
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), r.ids.begin(), r.ids.end() - 1);
  const std::vector<std::vector<double>> lp = TeacherForced(model, all);
  ASSERT_EQ(lp.size(), all.size());
  for (size_t k = 0; k < r.ids.size(); ++k) {
    EXPECT_NEAR(r.token_logprobs[k], lp[prompt.size() - 1 + k][r.ids[k]], 1e-4) << "token " << k;
  }
  const v1::PromptLogprobs& p = r.prompt_logprobs;
  ASSERT_EQ(p.logprobs_size(), static_cast<int>(prompt.size()) - 1);  // the first token has none
  ASSERT_EQ(p.top_size(), p.logprobs_size());
  EXPECT_EQ(std::vector<int32_t>(p.token_ids().begin(), p.token_ids().end()), prompt);
  for (size_t t = 0; t + 1 < prompt.size(); ++t) {
    EXPECT_NEAR(p.logprobs(t), lp[t][prompt[t + 1]], 1e-4) << "prompt token " << t + 1;
    ASSERT_EQ(p.top(t).candidates_size(), 2);
    const int32_t best =
        static_cast<int32_t>(std::max_element(lp[t].begin(), lp[t].end()) - lp[t].begin());
    EXPECT_EQ(p.top(t).candidates(0).id(), best);
  }
  // The same as the single-process engine's.
  SamplingParams sp;
  sp.temperature = 0.9f, sp.repetition_penalty = 1.3f, sp.seed = 21, sp.logprobs = true;
  StopParams stop;
  stop.max_new_tokens = 8, stop.ignore_eos = true;
  absl::StatusOr<GenerationResult> off = Generate(model, prompt, sp, stop);
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(r.ids, off->output_ids);
  ASSERT_EQ(off->logprobs.size(), r.token_logprobs.size());
  for (size_t k = 0; k < off->logprobs.size(); ++k)
    EXPECT_NEAR(r.token_logprobs[k], off->logprobs[k], 1e-5);
}

void ExpectSiblings(const std::string& router, const Model& model) {
  const std::vector<int32_t> prompt = {8, 16, 24, 32};
  v1::GenerateRequest req = Request(prompt, 12, 1.0f, 77);
  req.set_n(3);
  Result a = Call(router, req);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_EQ(a.ids_by_index.size(), 3u);
  ASSERT_EQ(a.finals.size(), 3u);
  std::set<std::vector<int32_t>> distinct;
  int completion = 0, prompt_tokens = 0;
  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(i);
    // Sibling i is the plain request seeded 77 + i.
    EXPECT_EQ(a.ids_by_index[i], Offline(model, prompt, 12, 1.0f, 77 + i).output_ids);
    distinct.insert(a.ids_by_index[i]);
    completion += a.finals[i].usage().completion_tokens();
    prompt_tokens += a.finals[i].usage().prompt_tokens();
  }
  EXPECT_EQ(distinct.size(), 3u);
  EXPECT_EQ(completion, 36);
  EXPECT_EQ(prompt_tokens, static_cast<int>(prompt.size()));  // the prompt counted once
  Result b = Call(router, req);                               // reproducible
  ASSERT_TRUE(b.status.ok());
  EXPECT_EQ(b.ids_by_index, a.ids_by_index);
  req.set_n(17);
  EXPECT_EQ(Call(router, req).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  req.set_n(-1);
  EXPECT_EQ(Call(router, req).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST(LogprobsTest, DisaggregatedCluster) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(Options(TinyModel(), "logprobs"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(TinyModel());
  ASSERT_TRUE(model.ok());
  ExpectLogprobsOfTheModel((*cluster)->router_address(), **model);
  ExpectSiblings((*cluster)->router_address(), **model);
}

TEST(LogprobsTest, ColocatedRouter) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(ColocatedOptions(TinyModel(), "logprobs_colocated"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(TinyModel());
  ASSERT_TRUE(model.ok());
  ExpectLogprobsOfTheModel((*cluster)->router_address(), **model);
  ExpectSiblings((*cluster)->router_address(), **model);
}

}  // namespace
}  // namespace moesh
