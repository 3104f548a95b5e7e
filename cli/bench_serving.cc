// moesh bench --serving: N concurrent streams against the real services,
// disaggregated cluster next to colocated mode, same load, one table.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/http_completion.h"
#include "cli/local_cluster.h"
#include "cli/serving_workload.h"
#include "common/model/config.h"
#include "common/service/device_flags.h"
#include "common/service/sampling_proto.h"
#include "moesh/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"

ABSL_DECLARE_FLAG(std::optional<int>, prompt_len);  // bench.cc: both modes read it
ABSL_DECLARE_FLAG(std::string, server);             // complete.cc: --server: a running cluster
ABSL_DECLARE_FLAG(std::optional<int>, kv_blocks);   // serve_local.cc: the decode pool
ABSL_FLAG(std::string, concurrency, "1,8,32",
          "--serving: concurrent streams, a row each (comma-separated).");
ABSL_FLAG(int, requests, 64, "--serving: requests per row.");
ABSL_FLAG(std::string, modes, "cluster,colocated",
          "--serving: what to serve with, a table section each: cluster, cluster-nopp (no "
          "ping-pong micro-batches), cluster-ucx, cluster-nccl, cluster-ipc, cluster-ipc-hostkv "
          "(the KV handed over through the host), colocated; a mode ending in -swap (cluster-swap, "
          "colocated-swap) preempts by swap (--preemption_mode=swap) instead of recompute, one "
          "ending in -http (cluster-http, colocated-http) sends its load through the router's "
          "OpenAI HTTP API (streamed /v1/completions; each stream keeps its connection alive), "
          "-http-close the same with a new connection a request.");
ABSL_FLAG(int, rebalance_timeline, 0,
          "--serving: instead of the table, this many seconds of a skewed expert placement with "
          "the router rebalancing: tokens/s and each expert worker's share, per second.");
ABSL_FLAG(int, rebalance_interval, 5, "--rebalance_timeline: the router's --rebalance_interval_s.");
ABSL_FLAG(std::string, expert_placement, "",
          "--rebalance_timeline: the expert workers' --experts, comma-separated (default: the "
          "first three quarters of the experts on one, the rest on another).");

namespace moesh::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct LoadResult {
  int ok = 0, failed = 0;
  int64_t output_tokens = 0;
  double seconds = 0;
  std::vector<double> ttft, itl, e2e;
  std::string first_error;
};

// With a LoadControl, RunLoad keeps sending requests (ignoring `requests`)
// until `stop`, adding every streamed token to `tokens` as it arrives.
struct LoadControl {
  std::atomic<bool> stop{false};
  std::atomic<int64_t> tokens{0};
};

// The CPU time (user + system) process `pid` has used, seconds, from
// /proc/PID/stat; -1 where it cannot be read (a process that is gone).
double CpuSeconds(pid_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos || close + 2 > stat.size()) return -1;
  // After ") ": state (field 3) ... utime (14) and stime (15), in clock ticks.
  std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 2), ' ');
  long long utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return -1;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// A prompt of `len` random token ids in [2, vocab).
std::vector<int> RandomPrompt(std::mt19937& rng, int len, int vocab) {
  std::vector<int> prompt(len);
  for (int& t : prompt) t = 2 + static_cast<int>(rng() % (vocab - 2));
  return prompt;
}

// The closed loop of RunLoad and RunHttpLoad: `concurrency` threads take
// request numbers i in [0, requests) (until control->stop, with a control),
// each sends request i with send(thread, i, rng) (rng seeded per thread) and
// the records are tallied.
LoadResult RunClosedLoop(
    int concurrency, int requests, const LoadControl* control,
    const std::function<RequestRecord(int thread, int i, std::mt19937& rng)>& send) {
  std::atomic<int> next{0};
  std::mutex mu;
  LoadResult out;
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&, c] {
      std::mt19937 rng(1000 + c);
      for (int i = next++; i < requests && (control == nullptr || !control->stop); i = next++) {
        const RequestRecord r = send(c, i, rng);
        std::lock_guard<std::mutex> lock(mu);
        if (r.code != grpc::StatusCode::OK) {
          ++out.failed;
          if (out.first_error.empty()) out.first_error = r.error;
          continue;
        }
        ++out.ok;
        out.output_tokens += r.output_tokens;
        out.ttft.push_back(r.ttft);
        out.itl.insert(out.itl.end(), r.itl.begin(), r.itl.end());
        out.e2e.push_back(r.e2e);
      }
    });
  }
  for (auto& t : threads) t.join();
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

// The preemptions so far of the cluster's decode engines (decode workers,
// a colocated router), from their metrics.
double Preemptions(const LocalCluster& cluster) {
  double n = 0;
  for (const LocalCluster::Process& p : cluster.processes()) {
    if (!absl::StartsWith(p.name, "decode-") && p.name != "router") continue;
    absl::StatusOr<std::string> text = ScrapeMetrics(p.metrics_address);
    if (text.ok()) n += MetricSum(*text, "moesh_decode_preemptions_total{");
  }
  return n;
}

// Every request samples with `sampling` (seeded per request when it is not
// greedy, so runs repeat).
LoadResult RunLoad(const std::string& server, int concurrency, int requests, int prompt_len,
                   int max_new, int vocab, const v1::SamplingParams& sampling,
                   LoadControl* control = nullptr) {
  if (control != nullptr) requests = std::numeric_limits<int>::max();
  auto channel = grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  std::vector<std::unique_ptr<v1::Generation::Stub>> stubs;
  for (int c = 0; c < concurrency; ++c) stubs.push_back(v1::Generation::NewStub(channel));
  return RunClosedLoop(concurrency, requests, control, [&](int c, int i, std::mt19937& rng) {
    v1::GenerateRequest req;
    for (int t : RandomPrompt(rng, prompt_len, vocab)) req.mutable_token_ids()->add_ids(t);
    *req.mutable_sampling() = sampling;
    if (sampling.temperature() > 0) req.mutable_sampling()->set_seed(static_cast<uint64_t>(i) + 1);
    req.mutable_stop()->set_max_new_tokens(max_new);
    req.mutable_stop()->set_ignore_eos(true);
    return StreamGenerate(stubs[c].get(), req, std::chrono::minutes(10), [&](int n) {
      if (control != nullptr) control->tokens += n;
    });
  });
}

// RunLoad's load through the router's OpenAI-compatible HTTP API at `to`
// (StreamCompletion, usage included).
LoadResult RunHttpLoad(const HttpEndpoint& to, int concurrency, int requests, int prompt_len,
                       int max_new, int vocab, const v1::SamplingParams& sampling,
                       bool keep_alive) {
  return RunClosedLoop(concurrency, requests, nullptr, [&](int, int i, std::mt19937& rng) {
    nlohmann::json body = {{"max_tokens", max_new},
                           {"ignore_eos", true},
                           {"temperature", sampling.temperature()},
                           {"top_p", sampling.top_p()},
                           {"top_k", sampling.top_k()}};
    body["prompt"] = RandomPrompt(rng, prompt_len, vocab);
    if (sampling.temperature() > 0) body["seed"] = i + 1;
    // Tokens timed by their ids (logprobs 0, return_tokens_as_token_ids), as
    // the gRPC rows time theirs: an event carrying k tokens adds k gaps of
    // its gap / k (a chunk's gap would put coalesced chunks into the tail).
    return StreamCompletion(to, std::move(body), /*token_ids=*/true, std::chrono::minutes(10),
                            keep_alive);
  });
}

}  // namespace

// --rebalance_timeline S: the cluster with a skewed placement (the first
// expert worker hosts three quarters of the experts) and the router's
// automatic rebalancing on, under a steady load for S seconds: per second,
// the output tokens/s, each expert worker's share of the routed tokens and
// the balance ratio (busiest worker over the mean), and the rebalances done.
absl::Status RunRebalanceTimeline(const ModelConfig& config, LocalClusterOptions o, int seconds,
                                  int concurrency, int prompt_len, int max_new) {
  const int e = config.n_routed_experts;
  std::string placement = absl::GetFlag(FLAGS_expert_placement);
  if (placement.empty()) placement = absl::StrCat("0-", 3 * e / 4 - 1, ",", 3 * e / 4, "-", e - 1);
  o.expert_workers = absl::StrSplit(placement, ',', absl::SkipEmpty());
  const int interval = absl::GetFlag(FLAGS_rebalance_interval);
  o.router.rebalance_interval_s = interval;
  o.router.rebalance_min_ratio = 1.2;
  o.router.rebalance_slots = e;
  o.work_dir = absl::StrCat("/tmp/moesh-bench-", getpid(), "-timeline");
  ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> cluster, LocalCluster::Start(o));
  std::vector<const LocalCluster::Process*> experts;
  const LocalCluster::Process* router = nullptr;
  for (const LocalCluster::Process& p : cluster->processes()) {
    if (absl::StartsWith(p.name, "expert-")) experts.push_back(&p);
    if (p.name == "router") router = &p;
  }
  std::printf(
      "rebalance timeline: expert workers %s, router --rebalance_interval_s=%lld "
      "--rebalance_min_ratio=1.2, "
      "%d streams, prompt %d, %d new tokens\n",
      placement.c_str(), static_cast<long long>(interval), concurrency, prompt_len, max_new);
  std::printf("| t s | out tok/s |");
  for (size_t w = 0; w < experts.size(); ++w) std::printf(" %s share |", experts[w]->name.c_str());
  std::printf(" balance (max/mean) | rebalances |\n|");
  for (size_t i = 0; i < experts.size() + 4; ++i) std::printf(" --- |");
  std::printf("\n");
  LoadControl control;
  std::thread load([&] {
    RunLoad(cluster->router_address(), concurrency, 0, prompt_len, max_new, config.vocab_size,
            v1::SamplingParams(), &control);
  });
  std::vector<double> last(experts.size(), 0);
  int64_t last_tokens = 0;
  auto t0 = Clock::now();
  for (int64_t t = 1; t <= seconds; ++t) {
    std::this_thread::sleep_until(t0 + std::chrono::seconds(t));
    const int64_t tokens = control.tokens.load();
    std::vector<double> delta(experts.size());
    double total = 0, busiest = 0;
    for (size_t w = 0; w < experts.size(); ++w) {
      absl::StatusOr<std::string> text = ScrapeMetrics(experts[w]->metrics_address);
      const double now = text.ok() ? MetricSum(*text, "moesh_expert_tokens_total{") : last[w];
      delta[w] = now - last[w];
      last[w] = now;
      total += delta[w];
      busiest = std::max(busiest, delta[w]);
    }
    absl::StatusOr<std::string> rt = ScrapeMetrics(router->metrics_address);
    const double rebalances =
        rt.ok() ? MetricValue(*rt, "moesh_rebalances_total{service=\"router\",result=\"ok\"}") : -1;
    std::printf("| %lld | %.1f |", static_cast<long long>(t),
                static_cast<double>(tokens - last_tokens));
    for (double d : delta) std::printf(" %.2f |", total > 0 ? d / total : 0.0);
    std::printf(" %.2f | %.0f |\n", total > 0 ? busiest / (total / experts.size()) : 0.0,
                rebalances);
    std::fflush(stdout);
    last_tokens = tokens;
  }
  control.stop = true;
  load.join();
  return absl::OkStatus();
}

absl::Status RunServingBench() {
  if (!absl::GetFlag(FLAGS_server).empty()) return RunOpenLoopBench();
  ASSIGN_OR_RETURN(const std::string model, ModelFlag());
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(model));
  ASSIGN_OR_RETURN(std::vector<int64_t> concurrencies,
                   ParseIntList("concurrency", absl::GetFlag(FLAGS_concurrency)));
  if (concurrencies.empty()) return absl::InvalidArgumentError("--concurrency: at least one");
  const int64_t requests = absl::GetFlag(FLAGS_requests);
  const int64_t prompt_len = absl::GetFlag(FLAGS_prompt_len).value_or(64);
  const int64_t max_new = absl::GetFlag(FLAGS_max_new_tokens).value_or(32);
  ASSIGN_OR_RETURN(const DeviceOptions device_options, DeviceOptionsFromFlags());
  const std::string& device = device_options.device;
  ASSIGN_OR_RETURN(const std::vector<std::string> expert_devices, ExpertDevicesFlag());
  const std::string expert_device = absl::GetFlag(FLAGS_expert_device);
  const int expert_workers = absl::GetFlag(FLAGS_expert_workers);
  if (expert_workers < 1) return absl::InvalidArgumentError("--expert_workers: at least 1");
  std::vector<std::string> modes =
      absl::StrSplit(absl::GetFlag(FLAGS_modes), ',', absl::SkipEmpty());
  const int timeline = absl::GetFlag(FLAGS_rebalance_timeline);
  ASSIGN_OR_RETURN(const SamplingParams sp, BenchSamplingFromFlags(config.vocab_size));
  v1::SamplingParams sampling;
  SamplingToProto(sp, &sampling);
  const std::string sampling_text =
      absl::StrCat(sp.temperature > 0 ? absl::StrCat("temperature ", sp.temperature, ", top-p ",
                                                     sp.top_p, ", top-k ", sp.top_k, ", seeded")
                                      : "greedy",
                   sp.logprobs ? ", each token's log-probability asked" : "");

  // Every mode's cluster: the workers on --device (the experts on
  // --expert_device when set), 4096 KV blocks unless --kv_blocks (a small
  // pool preempts).
  const int kv_blocks = absl::GetFlag(FLAGS_kv_blocks).value_or(4096);
  LocalClusterOptions base;
  base.model_dir = model;
  base.bin_dir = BinDirFlag();
  base.decode.kv.kv_blocks = kv_blocks;
  SetWorkerDevice(device_options, &base);
  RETURN_IF_ERROR(SetWorkerMemoryFromFlags(&base));
  base.expert_devices = expert_devices;
  if (timeline > 0) {
    return RunRebalanceTimeline(config, base, timeline, static_cast<int>(concurrencies.front()),
                                static_cast<int>(prompt_len), static_cast<int>(max_new));
  }
  std::printf(
      "serving bench: %s (%s) on %s (experts %s), %lld requests per row, prompt %lld tokens, %lld "
      "new tokens, "
      "%s\n",
      model.c_str(), config.Fingerprint().c_str(), device.c_str(),
      expert_device.empty() ? device.c_str() : expert_device.c_str(),
      static_cast<long long>(requests), static_cast<long long>(prompt_len),
      static_cast<long long>(max_new), sampling_text.c_str());
  // router / client us/tok: the CPU time the router process (in colocated
  // mode the engine too) and this bench process (the load's client threads)
  // used during the row, per output token: what each API costs a token on
  // either side.
  std::printf("%-18s %5s %8s %10s %12s %10s %10s %10s %10s %7s %8s %11s %11s\n", "mode", "conc",
              "req/s", "out tok/s", "e2e p50 ms", "ttft p50", "ttft p99", "itl p50", "itl p99",
              "errors", "preempt", "router us/t", "client us/t");
  for (const std::string& row_mode : modes) {
    LocalClusterOptions o = base;
    o.work_dir = absl::StrCat("/tmp/moesh-bench-", getpid(), "-", row_mode);
    for (int64_t i = 0; i < expert_workers; ++i)
      o.expert_workers.push_back(absl::StrCat(i, "/", expert_workers));
    // "<mode>-swap": <mode>, preempting by swap; "<mode>-http": <mode>, its
    // load sent through the router's OpenAI HTTP API on kept-alive
    // connections ("-http-close": a connection a request).
    std::string mode = row_mode;
    const bool http_close = absl::EndsWith(mode, "-http-close");
    if (http_close) mode.resize(mode.size() - 6);
    const bool http = absl::EndsWith(mode, "-http");
    if (http) {
      mode.resize(mode.size() - 5);
      o.router.http_listen = "127.0.0.1:0";
    }
    if (absl::EndsWith(mode, "-swap")) {
      mode.resize(mode.size() - 5);
      o.decode.kv.preemption_mode = "swap";
      o.router.kv.preemption_mode = "swap";
    }
    if (mode == "colocated") {
      o.router.colocated = true;
      o.router.kv.kv_blocks = kv_blocks;
      o.router.device.device = device;
      o.router.device.dummy_weights = device_options.dummy_weights;
      o.router.device.fp8_linears = device_options.fp8_linears;
      o.router.device.fp8_kv_cache = device_options.fp8_kv_cache;
      o.expert_workers = {"0-0"};
      o.num_prefill = 0;
      o.num_decode = 0;
    } else if (mode == "cluster-nopp") {
      o.prefill.dispatch.micro_batches = 1;  // ping-pong off, for comparison
      o.decode.dispatch.micro_batches = 1;
    } else if (mode == "cluster-ucx") {
      SetWorkerTransport("ucx", &o);
    } else if (mode == "cluster-nccl") {
      SetWorkerTransport("nccl", &o);
    } else if (mode == "cluster-ipc") {
      SetWorkerTransport("cuda_ipc", &o);
    } else if (mode == "cluster-ipc-hostkv") {  // cuda_ipc with the KV handed off through the host,
                                                // for comparison
      SetWorkerTransport("cuda_ipc", &o);
      o.prefill.kv_handoff = "host";
    } else if (mode != "cluster") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown mode \"", row_mode,
                       "\" (cluster, cluster-nopp, cluster-ucx, cluster-nccl, cluster-ipc, "
                       "cluster-ipc-hostkv, colocated; each with -swap, -http, -http-close or "
                       "-swap-http)"));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<LocalCluster> cluster, LocalCluster::Start(o));
    HttpEndpoint http_to;
    if (http) {
      ASSIGN_OR_RETURN(http_to, ParseHttpEndpoint(cluster->router_http_address()));
    }
    pid_t router_pid = -1;
    for (const LocalCluster::Process& p : cluster->processes()) {
      if (p.name == "router") router_pid = p.pid;
    }
    for (int64_t c : concurrencies) {
      const double preempted_before = Preemptions(*cluster);
      const double router_cpu0 = CpuSeconds(router_pid), client_cpu0 = CpuSeconds(::getpid());
      LoadResult r = http ? RunHttpLoad(http_to, static_cast<int>(c), static_cast<int>(requests),
                                        static_cast<int>(prompt_len), static_cast<int>(max_new),
                                        config.vocab_size, sampling, !http_close)
                          : RunLoad(cluster->router_address(), static_cast<int>(c),
                                    static_cast<int>(requests), static_cast<int>(prompt_len),
                                    static_cast<int>(max_new), config.vocab_size, sampling);
      // Per output token, microseconds; -1 where a process's time was not read.
      auto per_token = [&](double before, double after) {
        return before < 0 || after < 0 || r.output_tokens == 0
                   ? -1.0
                   : 1e6 * (after - before) / static_cast<double>(r.output_tokens);
      };
      const double router_us = per_token(router_cpu0, CpuSeconds(router_pid));
      const double client_us = per_token(client_cpu0, CpuSeconds(::getpid()));
      std::printf(
          "%-18s %5lld %8.2f %10.1f %12.1f %10.1f %10.1f %10.2f %10.2f %7d %8.0f %11.1f %11.1f\n",
          row_mode.c_str(), static_cast<long long>(c), r.ok / r.seconds,
          r.output_tokens / r.seconds, 1e3 * Percentile(r.e2e, 0.5), 1e3 * Percentile(r.ttft, 0.5),
          1e3 * Percentile(r.ttft, 0.99), 1e3 * Percentile(r.itl, 0.5),
          1e3 * Percentile(r.itl, 0.99), r.failed, Preemptions(*cluster) - preempted_before,
          router_us, client_us);
      if (r.failed > 0) std::printf("  first error: %s\n", r.first_error.c_str());
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

}  // namespace moesh::cli
