// Log-probabilities and sibling choices through real clusters (router,
// prefill, decode and expert workers as processes; and a colocated router):
// each generated token's own log-probability and the prompt's equal
// log_softmax of the model's logits computed here by teacher forcing; n
// siblings are distinct, reproducible, and each equals the single-process
// run with its derived seed; n over the limit is INVALID_ARGUMENT.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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

// n siblings share the prompt's KV: a fresh 150-token prompt (two full
// blocks of 64) asked with n = 3 is computed whole once; siblings 1 and 2
// find its two blocks in the prefix cache (the prefill worker's, or the
// colocated router's), and still sample what the plain seeded request does.
void ExpectSiblingsSharePrompt(const LocalCluster& cluster, const Model& model) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 150; ++i) prompt.push_back(2 + (i * 71 + 13) % 500);
  auto hits = [&] {
    double n = 0;
    for (const LocalCluster::Process& p : cluster.processes()) {
      if (p.name == "router" || absl::StartsWith(p.name, "prefill-"))
        n += Metric(p.metrics_address, "moesh_prefix_cache_hit_tokens_total");
    }
    return n;
  };
  const double before = hits();
  v1::GenerateRequest req = Request(prompt, 6, 1.0f, 91);
  req.set_n(3);
  const Result a = Call(cluster.router_address(), req);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  ASSERT_EQ(a.ids_by_index.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.ids_by_index.at(i), Offline(model, prompt, 6, 1.0f, 91 + i).output_ids)
        << "sibling " << i;
  }
  EXPECT_GE(hits() - before, 2 * 128) << "siblings 1 and 2 recomputed the prompt's blocks";
}

TEST(LogprobsTest, DisaggregatedCluster) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(Options(TinyModel(), "logprobs"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(TinyModel());
  ASSERT_TRUE(model.ok());
  ExpectLogprobsOfTheModel((*cluster)->router_address(), **model);
  ExpectSiblings((*cluster)->router_address(), **model);
  ExpectSiblingsSharePrompt(**cluster, **model);
}

TEST(LogprobsTest, ColocatedRouter) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(ColocatedOptions(TinyModel(), "logprobs_colocated"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(TinyModel());
  ASSERT_TRUE(model.ok());
  ExpectLogprobsOfTheModel((*cluster)->router_address(), **model);
  ExpectSiblings((*cluster)->router_address(), **model);
  ExpectSiblingsSharePrompt(**cluster, **model);
}

// --dispatch_dtype through real processes: the attention workers send bf16
// or FP8 hidden states to the expert workers (answers in bf16) over gRPC or
// UCX. Teacher-forced log-probabilities of the prompt and of the greedy
// continuation stay near the fp32 model's (the reference, computed here), the
// greedy choices agree with its, and the prefill worker counts the encoded
// bytes under the encoding's label.
struct WireCase {
  const char* name;
  const char* transport;
  const char* dtype;
  double max_delta;   // the bound on any |Δlogprob|
  double mean_delta;  // and on their mean
};

class DispatchDTypeTest : public ::testing::TestWithParam<WireCase> {};

TEST_P(DispatchDTypeTest, LogprobsStayNearFp32) {
  const WireCase& w = GetParam();
  setenv("UCX_NET_DEVICES", "lo", 1);
  setenv("UCX_TLS", "tcp", 1);
  LocalClusterOptions o = Options(TinyModel(), std::string("dtype_") + w.name);
  SetWorkerTransport(w.transport, &o);
  o.prefill.dispatch.dispatch_dtype = o.decode.dispatch.dispatch_dtype = w.dtype;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(TinyModel());
  ASSERT_TRUE(model.ok());
  std::vector<int32_t> prompt;
  for (int i = 0; i < 32; ++i) prompt.push_back((37 * i + 11) % 500);
  const int max_new = 24;
  v1::GenerateRequest req = Request(prompt, max_new);  // greedy
  req.mutable_sampling()->set_logprobs(true);
  req.mutable_sampling()->set_prompt_logprobs(1);
  Result r = Call((*cluster)->router_address(), req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.ids.size(), static_cast<size_t>(max_new));
  ASSERT_EQ(r.token_logprobs.size(), r.ids.size());
  ASSERT_EQ(r.prompt_logprobs.logprobs_size(), static_cast<int>(prompt.size()) - 1);
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), r.ids.begin(), r.ids.end() - 1);
  const std::vector<std::vector<double>> lp = TeacherForced(**model, all);
  ASSERT_EQ(lp.size(), all.size());
  double sum = 0, worst = 0;
  int n = 0, agree = 0;
  auto add = [&](double got, double want) {
    sum += std::fabs(got - want), worst = std::max(worst, std::fabs(got - want)), ++n;
  };
  for (size_t t = 0; t + 1 < prompt.size(); ++t)
    add(r.prompt_logprobs.logprobs(t), lp[t][prompt[t + 1]]);
  for (size_t k = 0; k < r.ids.size(); ++k) {
    const std::vector<double>& row = lp[prompt.size() - 1 + k];
    add(r.token_logprobs[k], row[r.ids[k]]);
    agree += r.ids[k] == std::max_element(row.begin(), row.end()) - row.begin();
  }
  // The fp32 engine's own greedy run, for the length of the common prefix.
  const std::vector<int32_t> ref = Offline(**model, prompt, max_new).output_ids;
  size_t same = 0;
  while (same < ref.size() && ref[same] == r.ids[same]) ++same;
  std::cout << "[dispatch_dtype " << w.dtype << " over " << w.transport << "] mean |dlogprob| "
            << sum / n << ", max " << worst << " over " << n << " logprobs; greedy agreement "
            << agree << "/" << r.ids.size() << "; first " << same << "/" << ref.size()
            << " tokens equal the fp32 run" << std::endl;
  EXPECT_LE(worst, w.max_delta);
  EXPECT_LE(sum / n, w.mean_delta);
  EXPECT_GT(sum / n, 1e-5) << "no rounding seen: was --dispatch_dtype " << w.dtype << " passed?";
  // The tiny random model has near-ties (a flipped one changes the rest of the
  // free-running sequence, hence teacher-forced agreement).
  EXPECT_GE(agree, static_cast<int>(r.ids.size()) * 9 / 10);
  // The bytes went out in the encoding asked for.
  absl::StatusOr<std::string> text = ScrapeMetrics(Proc(**cluster, "prefill-0").metrics_address);
  ASSERT_TRUE(text.ok()) << text.status();
  const std::string label = absl::StrCat("encoding=\"", w.dtype, "\"");
  bool counted = false;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    counted = counted || (absl::StartsWith(line, "moesh_expert_dispatch_bytes_total{") &&
                          absl::StrContains(line, label) && !absl::EndsWith(line, " 0"));
  }
  EXPECT_TRUE(counted) << *text;
  unsetenv("UCX_TLS");
}

// Measured (tiny v3, hidden 64: one 64-wide fp8 group a token; 55 logprobs):
// fp8 mean 0.0086, max 0.144, greedy agreement 23/24; bf16 mean 0.00049, max
// 0.0013, 24/24 (the fp32 cluster equals the model within 1e-4, above).
INSTANTIATE_TEST_SUITE_P(Wires, DispatchDTypeTest,
                         ::testing::Values(WireCase{"grpc_fp8", "grpc", "fp8", 0.25, 0.02},
                                           WireCase{"ucx_fp8", "ucx", "fp8", 0.25, 0.02},
                                           WireCase{"grpc_bf16", "grpc", "bf16", 0.01, 0.002}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace moesh
