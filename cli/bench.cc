// moesh bench: prefill and decode throughput of the colocated CPU engine
// (--serving: the services, bench_serving.cc). `--device cuda` hands over to
// cuda_model_bench (tools/bench/model_bench.cc), the GPU model's bench, since
// the moesh command itself does not link CUDA.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/status.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "common/model/model.h"
#include "common/model/weights.h"

ABSL_FLAG(bool, serving, false,
          "Concurrent streams against a local cluster and colocated mode (the services) instead "
          "of the engine in this process.");
ABSL_FLAG(bool, load, false,
          "Load rate instead: the checkpoint's files read raw (the disk's rate), then loaded as "
          "the CPU engine and an expert worker load them (bench_load.cc).");
ABSL_FLAG(std::string, batch, "1,4,16",
          "The engine bench's batch sizes (--dispatch: tokens a dispatch), comma-separated.");
ABSL_DECLARE_FLAG(bool, dispatch);
ABSL_FLAG(std::optional<int>, prompt_len, std::nullopt,
          "Prompt tokens per sequence (default: 128; --serving 64).");
ABSL_FLAG(int, decode_steps, 32, "The engine bench's decode steps per batch size.");

namespace moesh::cli {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Host memory bandwidth (bytes read + written per second) of a large memcpy:
// the ceiling a batch-1 decode step, which streams the weights, can reach.
double MeasureMemcpyBandwidth() {
  const size_t n = 256u << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 0.0;
  for (int i = 0; i < 5; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), n);
    auto t1 = std::chrono::steady_clock::now();
    best = std::max(best, 2.0 * n / Seconds(t0, t1));
    std::swap(a, b);
  }
  return best;
}

// float32 bytes a batch-1 decode step must read: everything but the routed
// experts, plus top_k experts per MoE layer.
double Batch1WeightBytes(const ModelConfig& c) {
  double total = 0.0;
  for (const TensorSpec& t : CheckpointSchema(c)) {
    double n = 4.0;
    for (int64_t d : t.shape) n *= static_cast<double>(d);
    if (t.name.find(".mlp.experts.") != std::string::npos)
      n *= static_cast<double>(c.num_experts_per_tok) / c.n_routed_experts;
    total += n;
  }
  return total;
}

}  // namespace

bool IsCudaEngineBench(const std::vector<std::string>& args) {
  // --serving --device cuda runs the services on the GPU instead; --load
  // --device cuda times the GPU's loads here (bench_load.cc).
  for (const std::string& a : args) {
    if (a == "--serving" || a == "--serving=true" || a == "--load" || a == "--load=true")
      return false;
  }
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--device=cuda" ||
        (args[i] == "--device" && i + 1 < args.size() && args[i + 1] == "cuda")) {
      return true;
    }
  }
  return false;
}

absl::Status ExecCudaBench(const std::vector<std::string>& args) {
  // moesh's spelling (--load_format) for cuda_model_bench's (--load-format).
  std::vector<std::string> translated;
  for (const std::string& a : args) {
    if (!absl::StartsWith(a, "--")) {
      translated.push_back(a);
      continue;
    }
    const size_t eq = a.find('=');
    const std::string name = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (absl::StrContains(name, '-')) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, " is spelled --",
                                                     absl::StrReplaceAll(name, {{"-", "_"}}),
                                                     " now (flags take underscores)"));
    }
    translated.push_back(absl::StrCat("--", absl::StrReplaceAll(name, {{"_", "-"}}),
                                      eq == std::string::npos ? "" : a.substr(eq)));
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string dir = ".";
  if (n > 0) {
    self[n] = '\0';
    dir = self;
    dir = dir.substr(0, dir.rfind('/'));
  }
  for (const std::string& path :
       {dir + "/cuda_model_bench", dir + "/tools/bench/cuda_model_bench"}) {
    if (access(path.c_str(), X_OK) != 0) continue;
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(path.c_str()));
    for (const std::string& a : translated) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(path.c_str(), argv.data());
    return absl::InternalError("exec " + path + ": " + std::strerror(errno));
  }
  return absl::UnavailableError(
      "--device cuda needs cuda_model_bench (built with the CUDA backend) in " + dir + " or " +
      dir + "/tools/bench");
}

absl::Status RunBench() {
  if (absl::GetFlag(FLAGS_serving)) return RunServingBench();
  if (absl::GetFlag(FLAGS_load)) return RunLoadBench();
  if (absl::GetFlag(FLAGS_dispatch)) return RunDispatchBench();
  ASSIGN_OR_RETURN(const std::string dir, ModelFlag());
  ASSIGN_OR_RETURN(std::vector<int64_t> batches, ParseIntList("batch", absl::GetFlag(FLAGS_batch)));
  if (batches.empty()) return absl::InvalidArgumentError("--batch: at least one size");
  const int64_t prompt_len = absl::GetFlag(FLAGS_prompt_len).value_or(128);
  const int64_t steps = absl::GetFlag(FLAGS_decode_steps);
  if (prompt_len < 1 || steps < 1)
    return absl::InvalidArgumentError("--prompt_len and --decode_steps must be >= 1");

  ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(dir));
  const ModelConfig& c = model->config();
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int32_t> tok(2, c.vocab_size - 1);

  std::printf("model %s (%s): hidden %d, layers %d, experts %d top-%d, vocab %d\n", dir.c_str(),
              c.model_type.c_str(), c.hidden_size, c.num_hidden_layers, c.n_routed_experts,
              c.num_experts_per_tok, c.vocab_size);
  const double bandwidth = MeasureMemcpyBandwidth();
  const double floor_ms = 1e3 * Batch1WeightBytes(c) / bandwidth;
  std::printf("memcpy bandwidth %.1f GB/s; batch-1 decode floor (weights read once) %.3f ms/step\n",
              bandwidth / 1e9, floor_ms);
  std::printf("%6s %10s %14s %14s %14s %14s\n", "batch", "prompt", "prefill tok/s", "decode tok/s",
              "step ms", "floor/step");
  for (int64_t b : batches) {
    if (b < 1) return absl::InvalidArgumentError("--batch sizes must be >= 1");
    std::vector<SequenceKvCache> caches(b, model->NewCache());
    std::vector<std::vector<int32_t>> prompts(b);
    std::vector<SequenceInput> inputs(b);
    for (int64_t i = 0; i < b; ++i) {
      for (int64_t t = 0; t < prompt_len; ++t) prompts[i].push_back(tok(rng));
      inputs[i] = {prompts[i], &caches[i]};
    }
    auto t0 = std::chrono::steady_clock::now();
    ASSIGN_OR_RETURN(std::vector<float> logits, model->Forward(inputs));
    auto t1 = std::chrono::steady_clock::now();
    std::vector<std::vector<int32_t>> next(b, std::vector<int32_t>(1));
    for (int64_t s = 0; s < steps; ++s) {
      for (int64_t i = 0; i < b; ++i) {
        next[i][0] = tok(rng);
        inputs[i] = {next[i], &caches[i]};
      }
      ASSIGN_OR_RETURN(logits, model->Forward(inputs));
    }
    auto t2 = std::chrono::steady_clock::now();
    const double prefill = Seconds(t0, t1), decode = Seconds(t1, t2);
    const double step_ms = 1e3 * decode / steps;
    std::printf("%6lld %10lld %14.1f %14.1f %14.2f %13.0f%%\n", static_cast<long long>(b),
                static_cast<long long>(prompt_len), b * prompt_len / prefill, b * steps / decode,
                step_ms, 100.0 * floor_ms / step_ms);
  }
  return absl::OkStatus();
}

}  // namespace moesh::cli
