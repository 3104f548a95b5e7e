// Chunked prefill (--max_num_batched_tokens 16) in real processes
// (LocalCluster): through a prefill worker (a long prompt over several
// passes, its KV handed to the decode worker after the last) and in a
// colocated router (prompt chunks mixed into the decode steps), and short
// prompts computed by a cluster's decode worker itself
// (--max_local_prefill_tokens). Greedy
// outputs equal the single-process engine's token for token while another
// stream decodes beside them, prompt log-probabilities computed in chunks
// equal its unchunked ones, and the workers' metrics show the chunks.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "cli/local_cluster.h"
#include "common/model/model.h"
#include "gtest/gtest.h"
#include "tests/integration/cluster_harness.h"

namespace moesh {
namespace {

constexpr int kBudget = 16;

std::vector<int32_t> Prompt(int n, int salt) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(2 + (i * 41 + salt * 97) % 500);
  return p;
}

// A decoding stream, then prompts of 100, 70 and 5 tokens at once: every
// output equals the offline engine's.
void ExpectExactUnderLoad(const std::string& router, const Model& model) {
  const std::vector<int32_t> stream_prompt = Prompt(3, 0);
  Result stream;
  std::thread t([&] { stream = Call(router, Request(stream_prompt, 60)); });
  const std::vector<std::vector<int32_t>> prompts = {Prompt(100, 1), Prompt(70, 2), Prompt(5, 3)};
  std::vector<Result> got(prompts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < prompts.size(); ++i)
    threads.emplace_back([&, i] { got[i] = Call(router, Request(prompts[i], 8)); });
  for (std::thread& th : threads) th.join();
  t.join();
  ASSERT_TRUE(stream.status.ok()) << stream.status.error_message();
  EXPECT_EQ(stream.ids, Offline(model, stream_prompt, 60).output_ids);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_TRUE(got[i].status.ok()) << i << ": " << got[i].status.error_message();
    EXPECT_EQ(got[i].ids, Offline(model, prompts[i], 8).output_ids) << "prompt " << i;
  }
}

// A prompt of 45 tokens (3 chunks) with prompt log-probabilities: as the
// single-process engine computes them in one pass.
void ExpectPromptLogprobsInChunks(const std::string& router, const Model& model) {
  const std::vector<int32_t> prompt = Prompt(45, 4);
  v1::GenerateRequest req = Request(prompt, 3);
  req.mutable_sampling()->set_prompt_logprobs(2);
  const Result r = Call(router, req);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  SamplingParams sp;
  sp.prompt_logprobs = 2;
  StopParams stop;
  stop.max_new_tokens = 3, stop.ignore_eos = true;
  absl::StatusOr<GenerationResult> off = Generate(model, prompt, sp, stop);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(r.ids, off->output_ids);
  const v1::PromptLogprobs& p = r.prompt_logprobs;
  ASSERT_EQ(p.logprobs_size(), 44);
  ASSERT_EQ(p.top_size(), 44);
  ASSERT_EQ(off->prompt_logprobs.logprobs.size(), 44u);
  for (int t = 0; t < 44; ++t) {
    EXPECT_NEAR(p.logprobs(t), off->prompt_logprobs.logprobs[t], 1e-5) << t;
    ASSERT_EQ(p.top(t).candidates_size(), 2);
    EXPECT_EQ(p.top(t).candidates(0).id(), off->prompt_logprobs.top[t][0].id) << t;
  }
}

// A cluster started with `o`, and the model it serves (the offline engine's).
struct Running {
  std::unique_ptr<LocalCluster> cluster;
  std::unique_ptr<Model> model;
  std::string router() const { return cluster->router_address(); }
  std::string metrics(const std::string& process) const {
    return Proc(*cluster, process).metrics_address;
  }
};

void Start(const LocalClusterOptions& o, Running* r) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(o.model_dir);
  ASSERT_TRUE(model.ok()) << model.status();
  r->cluster = std::move(*cluster);
  r->model = std::move(*model);
}

// A cluster whose prefill and decode workers chunk prompts by kBudget.
LocalClusterOptions ChunkedClusterOptions(const std::string& name) {
  LocalClusterOptions o = Options(TinyModel(), name);
  o.prefill.kv.max_num_batched_tokens = kBudget;
  o.decode.kv.max_num_batched_tokens = kBudget;
  return o;
}

TEST(ChunkedPrefillClusterTest, APrefillWorkerChunksLongPromptsTokenExact) {
  const LocalClusterOptions o = ChunkedClusterOptions("chunked_prefill");
  Running run;
  ASSERT_NO_FATAL_FAILURE(Start(o, &run));
  ExpectExactUnderLoad(run.router(), *run.model);
  // The 100- and 70-token prompts took 7 and 5 passes (fewer where the
  // prefix cache held a block): more pieces than prompts.
  const std::string p0 = run.metrics("prefill-0");
  EXPECT_GT(Metric(p0, "moesh_prefill_chunks_total"), 8);
  const double chunks = Metric(p0, "moesh_prefill_chunks_total");
  ExpectPromptLogprobsInChunks(run.router(), *run.model);
  EXPECT_EQ(Metric(p0, "moesh_prefill_chunks_total") - chunks, 3);
  EXPECT_EQ(Metric(run.metrics("router"), "moesh_local_prefills_total"), 0);  // flag off
}

TEST(ChunkedPrefillClusterTest, ADecodeWorkerComputesShortPromptsItselfTokenExact) {
  LocalClusterOptions o = ChunkedClusterOptions("local_prefill");
  o.router.max_local_prefill_tokens = 8;
  o.router.heartbeat_interval_ms = 100;  // the decode worker's cache hashes reach it sooner
  o.decode.kv.block_size = 16;
  o.prefill.kv.block_size = 16;
  Running run;
  ASSERT_NO_FATAL_FAILURE(Start(o, &run));
  ExpectExactUnderLoad(run.router(), *run.model);
  // The 3- and 5-token prompts ran on the decode worker (no KV handoff), the
  // 100- and 70-token ones on the prefill worker.
  const std::string p0 = run.metrics("prefill-0");
  const std::string d0 = run.metrics("decode-0");
  const std::string r = run.metrics("router");
  EXPECT_EQ(Metric(r, "moesh_local_prefills_total"), 2);
  EXPECT_EQ(Metric(p0, "moesh_prompt_tokens_total"), 170);
  EXPECT_EQ(Metric(d0, "moesh_decode_prompt_chunks_total"), 2);  // 3 and 5 < the budget
  // Prompt log-probabilities of a long prompt: on the prefill worker still.
  ExpectPromptLogprobsInChunks(run.router(), *run.model);
  EXPECT_EQ(Metric(p0, "moesh_prompt_tokens_total"), 170 + 45);
  // A short one with them: computed by the decode worker, as exactly.
  const std::vector<int32_t> prompt = Prompt(6, 5);
  v1::GenerateRequest req = Request(prompt, 4);
  req.mutable_sampling()->set_prompt_logprobs(1);
  const Result got = Call(run.router(), req);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.ids, Offline(*run.model, prompt, 4).output_ids);
  EXPECT_EQ(got.prompt_logprobs.logprobs_size(), 5);
  EXPECT_EQ(Metric(r, "moesh_local_prefills_total"), 3);
  EXPECT_EQ(Metric(p0, "moesh_prompt_tokens_total"), 170 + 45);
  // A chat's next turn: its history (turn 1's prompt and answer) is cached on
  // the decode worker, so the few new tokens are computed there too.
  std::vector<int32_t> chat = Prompt(40, 6);
  // 40 + 9 tokens: rows for 48 (the last token's comes with the next step), three blocks.
  const Result turn1 = Call(run.router(), Request(chat, 9));
  ASSERT_TRUE(turn1.status.ok()) << turn1.status.error_message();
  EXPECT_EQ(Metric(r, "moesh_local_prefills_total"), 3);  // 40 tokens: the prefill worker's
  chat.insert(chat.end(), turn1.ids.begin(), turn1.ids.end());
  for (int t = 0; t < 4; ++t) chat.push_back(11 + t);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the hashes reach the router
  const Result turn2 = Call(run.router(), Request(chat, 8));
  ASSERT_TRUE(turn2.status.ok()) << turn2.status.error_message();
  EXPECT_EQ(turn2.ids, Offline(*run.model, chat, 8).output_ids);
  EXPECT_EQ(Metric(r, "moesh_local_prefills_total"), 4);
  EXPECT_EQ(Metric(p0, "moesh_prompt_tokens_total"), 170 + 45 + 40);
  EXPECT_EQ(turn2.final.usage().cached_tokens(), 48);
}

TEST(ChunkedPrefillClusterTest, AColocatedRouterMixesPromptChunksIntoDecodeStepsTokenExact) {
  LocalClusterOptions o = ColocatedOptions(TinyModel(), "chunked_colocated");
  o.router.kv.max_num_batched_tokens = kBudget;
  Running run;
  ASSERT_NO_FATAL_FAILURE(Start(o, &run));
  ExpectExactUnderLoad(run.router(), *run.model);
  const std::string r = run.metrics("router");
  EXPECT_GT(Metric(r, "moesh_decode_prompt_chunks_total"), 8);
  // Steps of at most 16 tokens; the prompts' steps carried decode tokens too.
  const double steps = Metric(r, "moesh_decode_step_tokens_count");
  EXPECT_GT(steps, 8);
  EXPECT_EQ(Metric(r, "moesh_decode_step_tokens_bucket{service=\"router\",le=\"16\"}"), steps);
  const double chunks = Metric(r, "moesh_decode_prompt_chunks_total");
  ExpectPromptLogprobsInChunks(run.router(), *run.model);
  EXPECT_EQ(Metric(r, "moesh_decode_prompt_chunks_total") - chunks, 3);
}

}  // namespace
}  // namespace moesh
