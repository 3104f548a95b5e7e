// moesh bench --serving --server ADDR: load against a cluster that is
// already running, through its public gRPC API. Requests arrive as a Poisson
// process at --request_rate (inf: closed loop, --concurrency streams back to
// back; a finite rate is capped at --concurrency in flight too), drawn from a
// dataset (cli/serving_workload.h); one table row per rate and concurrency:
// throughput, TTFT/ITL/e2e percentiles, goodput under --slo_ttft_ms and
// --slo_itl_ms, the prefix-cache hit rate, and what was refused.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
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
#include "cli/serving_workload.h"
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

// Runs every conversation (its turns in order, each prompt the history so
// far) and returns each request's record; *seconds: first arrival to last end.
std::vector<RequestRecord> RunRow(const std::string& server,
                                  const std::vector<Conversation>& conversations,
                                  const RowOptions& o, double* seconds) {
  auto channel = grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::Generation::Stub> stub = v1::Generation::NewStub(channel);
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
        v1::GenerateRequest req;
        req.mutable_token_ids()->mutable_ids()->Add(history.begin(), history.end());
        *req.mutable_sampling() = o.sampling;
        if (o.sampling.temperature() > 0) req.mutable_sampling()->set_seed(i * 1000 + t + 1);
        req.mutable_stop()->set_max_new_tokens(max_new);
        req.mutable_stop()->set_ignore_eos(true);
        RequestRecord r = StreamGenerate(stub.get(), req, std::chrono::minutes(30));
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

// Text as token ids: the server's tokenizer, or (a model without one) a byte
// each, mapped into the vocabulary.
std::function<absl::StatusOr<std::vector<int32_t>>(const std::string&)> Tokenizer(
    v1::Generation::Stub* stub, const v1::ModelInfoResponse& info) {
  if (!info.has_tokenizer()) {
    const int vocab = info.vocab_size();
    return [vocab](const std::string& text) -> absl::StatusOr<std::vector<int32_t>> {
      std::vector<int32_t> ids;
      // About four bytes a token, as BPE vocabularies make English text.
      for (size_t i = 0; i < text.size(); i += 4)
        ids.push_back(2 + static_cast<unsigned char>(text[i]) % std::max(vocab - 2, 1));
      return ids;
    };
  }
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

}  // namespace

absl::Status RunOpenLoopBench() {
  const std::string server = absl::GetFlag(FLAGS_server);
  auto channel = grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  std::unique_ptr<v1::Generation::Stub> stub = v1::Generation::NewStub(channel);
  v1::ModelInfoResponse info;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    const grpc::Status s = stub->ModelInfo(&ctx, v1::ModelInfoRequest(), &info);
    if (!s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("--server ", server, ": ModelInfo failed: ", s.error_message()));
    }
  }
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
  const int vocab = info.vocab_size();
  const std::string dataset = absl::GetFlag(FLAGS_dataset);
  // Each row draws its own requests (seeded by the row; system prompts
  // included): a later row must not find its prompts in the prefix cache an
  // earlier row filled. A ShareGPT file's requests are the same every row
  // (so its later rows do hit the cache: run one row per server for those).
  std::function<std::vector<Conversation>(uint64_t)> draw;
  std::string what;
  if (dataset == "random") {
    draw = [=](uint64_t row) {
      return RandomDataset(requests, prompt_mean, output_mean, sigma, vocab, 1 + row);
    };
    what = absl::StrCat("random: prompt ~", prompt_mean, ", output ~", output_mean,
                        " tokens (lognormal, sigma ", sigma, ")");
  } else if (dataset == "multiturn") {
    const int turns = std::max(1, absl::GetFlag(FLAGS_turns));
    const int systems = absl::GetFlag(FLAGS_system_prompts);
    const int system_len = absl::GetFlag(FLAGS_system_prompt_len);
    draw = [=](uint64_t row) {
      return MultiTurnDataset((requests + turns - 1) / turns, turns, systems, system_len,
                              prompt_mean, output_mean, sigma, vocab, 1 + row);
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
                     ShareGptDataset(path, requests, Tokenizer(stub.get(), info)));
    what = absl::StrCat("sharegpt: ", path, " (", file.size(), " requests)");
    draw = [file = std::move(file)](uint64_t) { return file; };
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dataset: \"", dataset, "\" (random, sharegpt or multiturn)"));
  }
  const SamplingParams sp = SamplingFromFlags();  // greedy unless --temperature
  RETURN_IF_ERROR(sp.Validate(vocab));
  RowOptions o;
  SamplingToProto(sp, &o.sampling);
  o.max_context = info.max_context_tokens();
  o.max_new_limit = info.max_new_tokens_limit();
  const double slo_ttft = absl::GetFlag(FLAGS_slo_ttft_ms),
               slo_itl = absl::GetFlag(FLAGS_slo_itl_ms);
  std::printf("serving bench against %s (%s, vocab %d), %s\n", server.c_str(),
              info.model_type().c_str(), vocab, what.c_str());
  std::printf(
      "goodput: requests with TTFT <= %s and mean ITL <= %s; latencies in ms as p50 / p90 "
      "/ p99\n",
      slo_ttft > 0 ? absl::StrCat(slo_ttft, " ms").c_str() : "any",
      slo_itl > 0 ? absl::StrCat(slo_itl, " ms").c_str() : "any");
  std::printf(
      "| rate/s | conc | sent | done | refused | failed | s | req/s | out tok/s | goodput req/s | "
      "TTFT ms | ITL ms | e2e ms | cache hit |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  std::fflush(stdout);
  uint64_t row = 0;
  for (double rate : rates) {
    for (int64_t c : concurrencies) {
      o.rate = rate;
      o.concurrency = static_cast<int>(c);
      double seconds = 0;
      const std::vector<RequestRecord> records = RunRow(server, draw(row++), o, &seconds);
      const RunSummary s = RunSummary::Of(records, seconds, slo_ttft / 1e3, slo_itl / 1e3);
      std::printf(
          "| %s | %lld | %d | %d | %d | %d | %.2f | %.2f | %.1f | %.2f | %s | %s | %s | %.3f |\n",
          std::isfinite(rate) ? absl::StrCat(rate).c_str() : "inf", static_cast<long long>(c),
          s.sent, s.completed, s.refused, s.failed, s.seconds, s.completed / s.seconds,
          s.output_tokens / s.seconds, s.good / s.seconds, Ms3(s.ttft).c_str(), Ms3(s.itl).c_str(),
          Ms3(s.e2e).c_str(),
          s.prompt_tokens > 0 ? static_cast<double>(s.cached_tokens) / s.prompt_tokens : 0.0);
      if (!s.first_error.empty()) std::printf("  first error: %s\n", s.first_error.c_str());
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

}  // namespace moesh::cli
