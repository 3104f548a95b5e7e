// What `moesh bench --serving` sends and how it sums up what came back: the
// datasets (random lognormal lengths, a ShareGPT-format file, synthetic
// multi-turn chats with shared system prompts), one streamed Generate call
// timed token by token, and percentiles/goodput over a run.
//
// Prompts are token ids throughout (text is tokenized once, up front), so a
// dataset runs on any model, with or without a tokenizer.
#ifndef MOESH_CLI_SERVING_WORKLOAD_H_
#define MOESH_CLI_SERVING_WORKLOAD_H_

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "moesh/v1/generation.grpc.pb.h"

namespace moesh::cli {

// A conversation: its turns run in order on one stream of requests, turn t's
// prompt being turn t-1's prompt, the reply it got and user[t] (turn 0's:
// prefix + user[0]). A single request is a conversation of one turn.
struct Conversation {
  std::vector<int32_t> prefix;             // a shared system prompt, or empty
  std::vector<std::vector<int32_t>> user;  // per turn: the new prompt tokens
  std::vector<int> max_new_tokens;         // per turn
};

// Lengths drawn from a lognormal distribution of the given mean (sigma: of
// the underlying normal; 0: always the mean), at least 1.
int LognormalLength(double mean, double sigma, std::mt19937_64* rng);

// Token ids in [2, vocab) (0 and 1 are often BOS/EOS), uniform.
std::vector<int32_t> RandomTokens(int n, int vocab, std::mt19937_64* rng);

// `n` single-turn requests with lognormal prompt and output lengths.
std::vector<Conversation> RandomDataset(int n, double prompt_mean, double output_mean, double sigma,
                                        int vocab, uint64_t seed);

// Multi-turn chats: `n` conversations of `turns` turns; conversation i starts
// with system prompt i % system_prompts (each `system_len` tokens, shared by
// the conversations that use it), its user turns and replies lognormal.
std::vector<Conversation> MultiTurnDataset(int n, int turns, int system_prompts, int system_len,
                                           double prompt_mean, double output_mean, double sigma,
                                           int vocab, uint64_t seed);

// A ShareGPT-format JSON file: an array of {"conversations": [{"from":
// "human"|"user", "value": TEXT}, {"from": "gpt"|..., "value": TEXT}, ...]}.
// The first `n` entries whose first turn is a human's with a reply become
// single-turn requests: the human text tokenized by `tokenize`, max_new_tokens
// the reply's token count (at least 1). INVALID_ARGUMENT for a malformed file.
absl::StatusOr<std::vector<Conversation>> ShareGptDataset(
    const std::string& path, int n,
    const std::function<absl::StatusOr<std::vector<int32_t>>(const std::string&)>& tokenize);

// One Generate call, timed from its start.
struct RequestRecord {
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string error;
  double ttft = 0;          // seconds to the first token
  double e2e = 0;           // seconds to the end
  std::vector<double> itl;  // seconds between tokens (a message of k tokens: k gaps)
  int prompt_tokens = 0;
  int output_tokens = 0;
  int cached_tokens = 0;        // usage.cached_tokens
  std::vector<int32_t> output;  // the tokens, in order
  double start = 0;             // seconds from the run's start to the request's send
};

// Streams `request` through `stub` (deadline `timeout` from now). Each token
// batch also goes to `on_tokens` (may be null) as it arrives.
RequestRecord StreamGenerate(v1::Generation::Stub* stub, const v1::GenerateRequest& request,
                             std::chrono::seconds timeout,
                             const std::function<void(int)>& on_tokens = nullptr);

// The p-th percentile (p in [0, 1]) by nearest rank; 0 for no values.
double Percentile(std::vector<double> values, double p);

// Output tokens per second while `concurrency` streams ran side by side: from
// the moment the concurrency-th first token arrived (every stream producing)
// to the last request's send (after it the streams drain, fewer each time
// one ends), a token placed at its request's start + ttft + the gaps before
// it. A closed loop's steady state, without its ramp up and its tail; 0 when
// the window is empty (fewer requests than streams).
double SteadyTokensPerSecond(const std::vector<RequestRecord>& records, int concurrency);

// A run's summary (RunSummary::Of).
struct RunSummary {
  int sent = 0, completed = 0, refused = 0, failed = 0;  // refused: RESOURCE_EXHAUSTED
  double seconds = 0;
  int64_t prompt_tokens = 0, output_tokens = 0, cached_tokens = 0;
  int good = 0;  // completed within both SLOs
  // [p50, p90, p99] in seconds.
  double ttft[3] = {0, 0, 0}, itl[3] = {0, 0, 0}, e2e[3] = {0, 0, 0};
  std::string first_error;

  // Goodput counts a completed request whose TTFT <= slo_ttft_s and whose
  // mean inter-token latency <= slo_itl_s (an SLO <= 0 is not checked).
  static RunSummary Of(const std::vector<RequestRecord>& records, double seconds, double slo_ttft_s,
                       double slo_itl_s);
};

}  // namespace moesh::cli

#endif  // MOESH_CLI_SERVING_WORKLOAD_H_
