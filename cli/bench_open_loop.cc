// moesh bench --serving --server ADDR: load against a server that is already
// running, through moesh's public gRPC API (ADDR host:port) or any
// OpenAI-compatible HTTP API (ADDR http://host:port: streamed
// /v1/completions of token ids, cli/http_completion.h). Requests arrive as a Poisson
// process at --request_rate (inf: closed loop, --concurrency streams back to
// back; a finite rate is capped at --concurrency in flight too), drawn from a
// dataset (cli/serving_workload.h); one table row per rate and concurrency:
// throughput, TTFT/ITL/e2e percentiles, goodput under --slo_ttft_ms and
// --slo_itl_ms, the prefix-cache hit rate, what was refused, and (closed loop)
// the steady output rate while every stream ran (SteadyTokensPerSecond).
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/status.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/http_completion.h"
#include "cli/serving_workload.h"
#include "common/model/config.h"
#include "common/service/sampling_proto.h"

ABSL_DECLARE_FLAG(std::optional<int>, prompt_len);  // bench.cc
ABSL_DECLARE_FLAG(std::string, concurrency);        // bench_serving.cc
ABSL_DECLARE_FLAG(int, requests);                   // bench_serving.cc
ABSL_DECLARE_FLAG(std::string, server);             // complete.cc
ABSL_FLAG(std::string, request_rate, "inf",
          "--serving --server: request arrivals per second, a Poisson process (inf: closed loop "
          "at --concurrency), a table row each (comma-separated). Multi-turn: conversations per "
          "second.");
ABSL_FLAG(std::string, dataset, "random",
          "--serving --server: random (lognormal lengths of mean --prompt_len and "
          "--max_new_tokens), sharegpt (--dataset_path, a ShareGPT-format JSON file), multiturn "
          "(chats of --turns turns, each conversation starting with one of --system_prompts "
          "shared system prompts of --system_prompt_len tokens, its history growing). Each "
          "table row draws its requests afresh (a ShareGPT file's are the same every row).");
ABSL_FLAG(std::string, dataset_path, "", "--dataset sharegpt: the JSON file.");
ABSL_FLAG(double, length_sigma, 0.5,
          "--dataset random/multiturn: sigma of the lognormal lengths (0: every length the mean).");
ABSL_FLAG(int, turns, 4, "--dataset multiturn: turns per conversation.");
ABSL_FLAG(int, system_prompts, 4, "--dataset multiturn: distinct shared system prompts.");
ABSL_FLAG(int, system_prompt_len, 256, "--dataset multiturn: tokens per system prompt.");
ABSL_FLAG(double, slo_ttft_ms, 0, "--serving --server: the goodput's TTFT bound (0: none).");
ABSL_FLAG(double, slo_itl_ms, 0,
          "--serving --server: the goodput's bound on a request's mean inter-token latency (0: "
          "none).");

namespace moesh::cli {
namespace {

using Clock = std::chrono::steady_clock;

// A counting semaphore: at most `n` conversations in flight.
class Slots {
 public:
  explicit Slots(int n) : free_(n) {}
  void Acquire() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* f) { return *f > 0; }, &free_));
    --free_;
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    ++free_;
  }

 private:
  absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
};

struct RowOptions {
  double rate = 0;  // arrivals per second; inf: closed loop
  int concurrency = 1;
  int max_context = 0;    // prompt + output
  int max_new_limit = 0;  // output
  v1::SamplingParams sampling;
};

// Sends one turn: the prompt (the conversation's history), at most max_new
// tokens, and the request's seed for sampled runs; the record's output is
// what the next turn appends to the history.
using SendTurn =
    std::function<RequestRecord(const std::vector<int32_t>& prompt, int max_new, uint64_t seed)>;

// Runs every conversation (its turns in order, each prompt the history so
// far) through `send` and returns each request's record; *seconds: first
// arrival to last end.
std::vector<RequestRecord> RunRow(const SendTurn& send,
                                  const std::vector<Conversation>& conversations,
                                  const RowOptions& o, double* seconds) {
  absl::Mutex mu;
  std::vector<RequestRecord> records;
  Slots slots(o.concurrency);
  std::mt19937_64 rng(7);
  std::exponential_distribution<double> gap(std::isfinite(o.rate) ? o.rate : 1.0);
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  double at = 0;  // seconds after start
  for (size_t i = 0; i < conversations.size(); ++i) {
    if (std::isfinite(o.rate)) {
      if (i > 0) at += gap(rng);
      std::this_thread::sleep_until(
          start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(at)));
    }
    slots.Acquire();
    threads.emplace_back([&, i] {
      const Conversation& c = conversations[i];
      std::vector<int32_t> history = c.prefix;
      for (size_t t = 0; t < c.user.size(); ++t) {
        history.insert(history.end(), c.user[t].begin(), c.user[t].end());
        // Within the server's limits (a long tail of the lengths, a history
        // grown past the context: the conversation ends there).
        const int max_new = std::min({c.max_new_tokens[t], o.max_new_limit,
                                      o.max_context - static_cast<int>(history.size())});
        if (max_new < 1) break;
        const double sent_at = std::chrono::duration<double>(Clock::now() - start).count();
        RequestRecord r = send(history, max_new, i * 1000 + t + 1);
        r.start = sent_at;
        const bool ok = r.code == grpc::StatusCode::OK;
        history.insert(history.end(), r.output.begin(), r.output.end());
        r.output.clear();
        {
          absl::MutexLock lock(&mu);
          records.push_back(std::move(r));
        }
        if (!ok) break;
      }
      slots.Release();
    });
  }
  for (std::thread& t : threads) t.join();
  *seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return records;
}

// Turns over moesh's gRPC API (moesh.v1.Generation at `server`).
SendTurn GrpcTurns(std::shared_ptr<v1::Generation::Stub> stub, const v1::SamplingParams& sampling) {
  return [stub = std::move(stub), sampling](const std::vector<int32_t>& prompt, int max_new,
                                            uint64_t seed) {
    v1::GenerateRequest req;
    req.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
    *req.mutable_sampling() = sampling;
    if (sampling.temperature() > 0) req.mutable_sampling()->set_seed(seed);
    req.mutable_stop()->set_max_new_tokens(max_new);
    req.mutable_stop()->set_ignore_eos(true);
    return StreamGenerate(stub.get(), req, std::chrono::minutes(30));
  };
}

// Turns over an OpenAI-compatible HTTP API: streamed /v1/completions of the
// token ids (StreamCompletion: the answer's ids come back by
// return_tokens_as_token_ids).
SendTurn HttpTurns(const HttpEndpoint& to, const std::string& model,
                   const v1::SamplingParams& sampling) {
  return [to, model, sampling](const std::vector<int32_t>& prompt, int max_new, uint64_t seed) {
    nlohmann::json body = {{"model", model},
                           {"prompt", prompt},
                           {"max_tokens", max_new},
                           {"ignore_eos", true},
                           {"temperature", sampling.temperature()},
                           {"top_p", sampling.top_p()}};
    if (sampling.top_k() > 0) body["top_k"] = sampling.top_k();
    if (sampling.temperature() > 0) body["seed"] = seed;
    return StreamCompletion(to, std::move(body), /*token_ids=*/true, std::chrono::minutes(30));
  };
}

// Text as token ids without a tokenizer: a token every four bytes, mapped
// into the vocabulary (a ShareGPT file's lengths, roughly).
std::function<absl::StatusOr<std::vector<int32_t>>(const std::string&)> ApproximateTokenizer(
    int vocab) {
  return [vocab](const std::string& text) -> absl::StatusOr<std::vector<int32_t>> {
    std::vector<int32_t> ids;
    // About four bytes a token, as BPE vocabularies make English text.
    for (size_t i = 0; i < text.size(); i += 4)
      ids.push_back(2 + static_cast<unsigned char>(text[i]) % std::max(vocab - 2, 1));
    return ids;
  };
}

std::function<absl::StatusOr<std::vector<int32_t>>(const std::string&)> Tokenizer(
    v1::Generation::Stub* stub, const v1::ModelInfoResponse& info) {
  if (!info.has_tokenizer()) return ApproximateTokenizer(info.vocab_size());
  return [stub](const std::string& text) -> absl::StatusOr<std::vector<int32_t>> {
    v1::TokenizeRequest req;
    req.set_text(text);
    v1::TokenizeResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status s = stub->Tokenize(&ctx, req, &resp);
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("Tokenize: ", s.error_message()));
    return std::vector<int32_t>(resp.token_ids().begin(), resp.token_ids().end());
  };
}

std::string Ms3(const double (&v)[3]) {
  return absl::StrFormat("%.2f / %.2f / %.2f", 1e3 * v[0], 1e3 * v[1], 1e3 * v[2]);
}

// The server's side of a run: its limits, how to send it a turn, how to
// make token ids of a dataset's text.
struct Target {
  std::string describe;  // for the table's header
  int vocab = 0;
  int max_context = 0;    // prompt + output
  int max_new_limit = 0;  // output
  std::function<SendTurn(const v1::SamplingParams&)> turns;
  std::function<absl::StatusOr<std::vector<int32_t>>(const std::string&)> tokenize;
};

// moesh's gRPC API: its ModelInfo.
absl::StatusOr<Target> GrpcTarget(const std::string& server) {
  auto channel = grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  std::shared_ptr<v1::Generation::Stub> stub = v1::Generation::NewStub(channel);
  v1::ModelInfoResponse info;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  const grpc::Status s = stub->ModelInfo(&ctx, v1::ModelInfoRequest(), &info);
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("--server ", server, ": ModelInfo failed: ", s.error_message()));
  }
  Target t;
  t.describe = absl::StrCat(server, " (", info.model_type(), ", vocab ", info.vocab_size(), ")");
  t.vocab = info.vocab_size();
  t.max_context = info.max_context_tokens();
  t.max_new_limit = info.max_new_tokens_limit();
  t.turns = [stub](const v1::SamplingParams& sampling) { return GrpcTurns(stub, sampling); };
  t.tokenize = Tokenizer(stub.get(), info);
  return t;
}

// An OpenAI-compatible HTTP API: its /v1/models (the first model; its
// max_model_len, and moesh's vocab_size extension unless --model names the
// checkpoint to take the vocabulary from).
absl::StatusOr<Target> HttpTarget(const std::string& server) {
  ASSIGN_OR_RETURN(HttpEndpoint to, ParseHttpEndpoint(server));
  to.api_key = ApiKeyFlag();
  absl::StatusOr<std::string> body = HttpGet(to, "/v1/models", std::chrono::seconds(30));
  if (!body.ok())
    return absl::UnavailableError(absl::StrCat("--server ", server, ": ", body.status().message()));
  const nlohmann::json models = nlohmann::json::parse(*body, nullptr, false);
  if (!models.is_object() || !models.contains("data") || !models["data"].is_array() ||
      models["data"].empty() || !models["data"][0].is_object() ||
      !models["data"][0].contains("id") || !models["data"][0]["id"].is_string()) {
    return absl::UnavailableError(
        absl::StrCat("--server ", server, ": /v1/models lists no model: ", body->substr(0, 200)));
  }
  const nlohmann::json& m = models["data"][0];
  Target t;
  const std::string model = m["id"].get<std::string>();
  const int listed_vocab = m.contains("vocab_size") && m["vocab_size"].is_number_integer()
                               ? m["vocab_size"].get<int>()
                               : 0;
  t.max_context = m.contains("max_model_len") && m["max_model_len"].is_number_integer()
                      ? m["max_model_len"].get<int>()
                      : 0;
  if (const std::string dir = absl::GetFlag(FLAGS_model); !dir.empty()) {
    ASSIGN_OR_RETURN(const ModelConfig config, ModelConfig::Load(dir));
    t.vocab = config.vocab_size;
    if (t.max_context <= 0) t.max_context = config.max_position_embeddings;
  } else {
    t.vocab = listed_vocab;
  }
  if (t.vocab <= 2 || t.max_context <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--server ", server, ": /v1/models gives no ",
                     t.vocab <= 2 ? "vocab_size" : "max_model_len", " for model \"", model,
                     "\": pass --model DIR, the checkpoint it serves (config.json)"));
  }
  t.max_new_limit = t.max_context;
  t.describe = absl::StrCat(server, " (OpenAI HTTP API, model ", model, ", vocab ", t.vocab, ")");
  t.turns = [to, model](const v1::SamplingParams& sampling) {
    return HttpTurns(to, model, sampling);
  };
  t.tokenize = ApproximateTokenizer(t.vocab);
  return t;
}

}  // namespace

absl::Status RunOpenLoopBench() {
  const std::string server = absl::GetFlag(FLAGS_server);
  ASSIGN_OR_RETURN(const Target target,
                   IsHttpServer(server) ? HttpTarget(server) : GrpcTarget(server));
  ASSIGN_OR_RETURN(std::vector<int64_t> concurrencies,
                   ParseIntList("concurrency", absl::GetFlag(FLAGS_concurrency)));
  std::vector<double> rates;
  for (absl::string_view r :
       absl::StrSplit(absl::GetFlag(FLAGS_request_rate), ',', absl::SkipEmpty())) {
    double v;
    if (r == "inf") {
      v = std::numeric_limits<double>::infinity();
    } else if (!absl::SimpleAtod(r, &v) || !(v > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--request_rate: \"", r, "\" is not a positive number or inf"));
    }
    rates.push_back(v);
  }
  if (rates.empty() || concurrencies.empty())
    return absl::InvalidArgumentError("--request_rate and --concurrency: at least one value each");
  for (int64_t c : concurrencies) {
    if (c < 1) return absl::InvalidArgumentError("--concurrency: each at least 1");
  }
  const int requests = absl::GetFlag(FLAGS_requests);
  if (requests < 1) return absl::InvalidArgumentError("--requests: at least 1");
  const double prompt_mean = absl::GetFlag(FLAGS_prompt_len).value_or(64);
  const double output_mean = absl::GetFlag(FLAGS_max_new_tokens).value_or(32);
  const double sigma = absl::GetFlag(FLAGS_length_sigma);
  const int vocab = target.vocab;
  const std::string dataset = absl::GetFlag(FLAGS_dataset);
  // Each row draws its own requests (seeded by --seed, 1 unless set, plus the
  // row; system prompts included): a later row must not find its prompts in
  // the prefix cache an earlier row filled, nor a later run with another
  // --seed an earlier run's. A ShareGPT file's requests are the same every
  // row (so its later rows do hit the cache: run one row per server for those).
  const uint64_t seed = absl::GetFlag(FLAGS_seed).value_or(1);
  std::function<std::vector<Conversation>(uint64_t)> draw;
  std::string what;
  if (dataset == "random") {
    draw = [=](uint64_t row) {
      return RandomDataset(requests, prompt_mean, output_mean, sigma, vocab, seed + row);
    };
    what = absl::StrCat("random: prompt ~", prompt_mean, ", output ~", output_mean,
                        " tokens (lognormal, sigma ", sigma, ")");
  } else if (dataset == "multiturn") {
    const int turns = std::max(1, absl::GetFlag(FLAGS_turns));
    const int systems = absl::GetFlag(FLAGS_system_prompts);
    const int system_len = absl::GetFlag(FLAGS_system_prompt_len);
    draw = [=](uint64_t row) {
      return MultiTurnDataset((requests + turns - 1) / turns, turns, systems, system_len,
                              prompt_mean, output_mean, sigma, vocab, seed + row);
    };
    const std::vector<Conversation> conversations = draw(0);
    what = absl::StrCat("multiturn: ", conversations.size(), " conversations of ", turns,
                        " turns, ", absl::GetFlag(FLAGS_system_prompts),
                        " shared system prompts of ", absl::GetFlag(FLAGS_system_prompt_len),
                        " tokens, turns ~", prompt_mean, " + ~", output_mean, " tokens");
  } else if (dataset == "sharegpt") {
    const std::string path = absl::GetFlag(FLAGS_dataset_path);
    if (path.empty()) return absl::InvalidArgumentError("--dataset sharegpt needs --dataset_path");
    ASSIGN_OR_RETURN(std::vector<Conversation> file,
                     ShareGptDataset(path, requests, target.tokenize));
    what = absl::StrCat("sharegpt: ", path, " (", file.size(), " requests)");
    draw = [file = std::move(file)](uint64_t) { return file; };
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dataset: \"", dataset, "\" (random, sharegpt or multiturn)"));
  }
  ASSIGN_OR_RETURN(const SamplingParams sp, BenchSamplingFromFlags(vocab));
  RowOptions o;
  SamplingToProto(sp, &o.sampling);
  o.max_context = target.max_context;
  o.max_new_limit = target.max_new_limit;
  const SendTurn send = target.turns(o.sampling);
  const double slo_ttft = absl::GetFlag(FLAGS_slo_ttft_ms),
               slo_itl = absl::GetFlag(FLAGS_slo_itl_ms);
  std::printf("serving bench against %s, %s\n", target.describe.c_str(), what.c_str());
  std::printf(
      "goodput: requests with TTFT <= %s and mean ITL <= %s; latencies in ms as p50 / p90 "
      "/ p99\n",
      slo_ttft > 0 ? absl::StrCat(slo_ttft, " ms").c_str() : "any",
      slo_itl > 0 ? absl::StrCat(slo_itl, " ms").c_str() : "any");
  std::printf(
      "| rate/s | conc | sent | done | refused | failed | s | req/s | out tok/s | goodput req/s | "
      "TTFT ms | ITL ms | e2e ms | cache hit | steady out tok/s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  uint64_t row = 0;
  for (double rate : rates) {
    for (int64_t c : concurrencies) {
      o.rate = rate;
      o.concurrency = static_cast<int>(c);
      double seconds = 0;
      const std::vector<RequestRecord> records = RunRow(send, draw(row++), o, &seconds);
      const RunSummary s = RunSummary::Of(records, seconds, slo_ttft / 1e3, slo_itl / 1e3);
      // Closed loop: the rate while every stream ran (no ramp, no tail).
      const double steady_rate = SteadyTokensPerSecond(records, static_cast<int>(c));
      const std::string steady =
          !std::isfinite(rate) && steady_rate > 0 ? absl::StrFormat("%.1f", steady_rate) : "-";
      std::printf(
          "| %s | %lld | %d | %d | %d | %d | %.2f | %.2f | %.1f | %.2f | %s | %s | %s | %.3f | %s "
          "|\n",
          std::isfinite(rate) ? absl::StrCat(rate).c_str() : "inf", static_cast<long long>(c),
          s.sent, s.completed, s.refused, s.failed, s.seconds, s.completed / s.seconds,
          s.output_tokens / s.seconds, s.good / s.seconds, Ms3(s.ttft).c_str(), Ms3(s.itl).c_str(),
          Ms3(s.e2e).c_str(),
          s.prompt_tokens > 0 ? static_cast<double>(s.cached_tokens) / s.prompt_tokens : 0.0,
          steady.c_str());
      if (!s.first_error.empty()) std::printf("  first error: %s\n", s.first_error.c_str());
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

}  // namespace moesh::cli
