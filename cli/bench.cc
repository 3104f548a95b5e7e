// moesh bench: prefill and decode throughput of the colocated CPU engine.
// `--device cuda` hands over to cuda_model_bench (tools/bench/model_bench.cc), the
// GPU model's bench, since the moesh command itself does not link CUDA.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"
#include "common/base/status.h"
#include "common/model/model.h"
#include "common/model/weights.h"

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

// Replaces this process with cuda_model_bench (beside this binary, or in
// kernels/cuda/ below it, as the CMake build lays them out) and `argv`.
absl::Status ExecCudaBench(const std::vector<std::string>& argv) {
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
    std::vector<char*> args;
    args.push_back(const_cast<char*>(path.c_str()));
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(path.c_str(), args.data());
    return absl::InternalError("exec " + path + ": " + std::strerror(errno));
  }
  return absl::UnavailableError(
      "--device cuda needs cuda_model_bench (built with the CUDA backend) in " + dir + " or " +
      dir + "/tools/bench");
}

}  // namespace

absl::Status RunBench(const std::vector<std::string>& argv) {
  // The engine bench on the GPU is cuda_model_bench; --serving --device cuda
  // runs the services on the GPU instead.
  const bool serving = std::find(argv.begin(), argv.end(), "--serving") != argv.end();
  for (size_t i = 0; i < argv.size() && !serving; ++i) {
    const bool cuda = argv[i] == "--device=cuda" ||
                      (argv[i] == "--device" && i + 1 < argv.size() && argv[i + 1] == "cuda");
    if (cuda) return ExecCudaBench(argv);
  }
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argv,
                  {"model", "batch", "prompt-len", "decode-steps", "concurrency", "requests",
                   "max-new-tokens", "modes", "bin-dir", "device", "expert-device", "load-format",
                   "expert-workers", "rebalance-timeline", "rebalance-interval", "expert-placement",
                   "temperature", "top-p", "top-k"},
                  {"serving"}));
  if (args.Bool("serving")) return RunServingBench(args);
  ASSIGN_OR_RETURN(std::string dir, args.Required("model"));
  ASSIGN_OR_RETURN(std::vector<int64_t> batches, args.IntList("batch"));
  if (batches.empty()) batches = {1, 4, 16};
  ASSIGN_OR_RETURN(int64_t prompt_len, args.Int("prompt-len", 128));
  ASSIGN_OR_RETURN(int64_t steps, args.Int("decode-steps", 32));
  if (prompt_len < 1 || steps < 1)
    return absl::InvalidArgumentError("--prompt-len and --decode-steps must be >= 1");

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
