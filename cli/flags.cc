#include "cli/flags.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "cli/args.h"
#include "cli/local_cluster.h"

ABSL_FLAG(std::string, model, "",
          "Model directory: config.json, the safetensors weights (none with --load_format dummy), "
          "tokenizer.json for text.");
ABSL_FLAG(std::string, prompt_ids, "", "The prompt as token ids, comma-separated: 5,17,300.");
ABSL_FLAG(std::optional<int>, max_new_tokens, std::nullopt,
          "Most tokens to generate per request (default: generate 16, bench --serving 32, "
          "complete the router's --default_max_new_tokens).");
ABSL_FLAG(std::string, stop_token_ids, "", "Token ids that end generation, comma-separated.");
ABSL_FLAG(bool, ignore_eos, false, "Keep generating past the end-of-sequence token.");
ABSL_FLAG(bool, json, false, "Print the result as one JSON object.");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature (0: greedy).");
ABSL_FLAG(int, top_k, 0, "Sample among the k most likely tokens (0: all).");
ABSL_FLAG(double, top_p, 1.0,
          "Sample among the most likely tokens whose probabilities add up to this, in (0, 1].");
ABSL_FLAG(double, min_p, 0.0, "Drop tokens less likely than this times the most likely one.");
ABSL_FLAG(int, top_logprobs, 0, "Report the log-probabilities of the k most likely tokens a step.");
ABSL_FLAG(std::optional<int>, logprobs, std::nullopt,
          "Report each generated token's own log-probability (of the raw logits, before "
          "penalties and temperature) and its K most likely alternatives (0: its own only).");
ABSL_FLAG(std::optional<int>, prompt_logprobs, std::nullopt,
          "Report every prompt token's log-probability given the tokens before it (a "
          "teacher-forced evaluation), with its K most likely alternatives.");
ABSL_FLAG(int, n, 1,
          "Sibling generations of the prompt (seeds seed, seed+1, ... when --seed is given).");
ABSL_FLAG(double, repetition_penalty, 1.0,
          "Penalty on the tokens of the prompt and the output so far (> 0; 1: off).");
ABSL_FLAG(double, presence_penalty, 0.0,
          "Subtracted from the logit of each token the output holds, in [-2, 2].");
ABSL_FLAG(double, frequency_penalty, 0.0,
          "Subtracted from a token's logit once per time the output holds it, in [-2, 2].");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt,
          "Random seed: of the sampling (generate, complete; default: unseeded), of the weights "
          "(mkmodel; default 0), of the requests bench --serving --server draws (default 1; a "
          "row's are drawn from seed + row).");
ABSL_FLAG(double, decode_gpu_memory_utilization,
          moesh::LocalDecodeDefaults().device.gpu_memory_utilization,
          "serve-local, bench --serving (GPU): the share of the GPU the decode workers fill, what "
          "is in use counted (the expert workers' weights when they share it).");
ABSL_FLAG(double, prefill_gpu_memory_utilization,
          moesh::LocalPrefillDefaults().device.gpu_memory_utilization,
          "serve-local, bench --serving (GPU): the share of the GPU the prefill workers fill, "
          "from where the decode workers' ends.");
ABSL_FLAG(std::string, bin_dir, "",
          "Where moesh_router and the moesh_*_worker binaries are (default: beside this moesh).");
ABSL_FLAG(int, expert_workers, 2, "Expert workers to start, each with an equal shard.");
ABSL_FLAG(std::string, api_key, "",
          "The router's API key (sent as 'Authorization: Bearer <key>'); default: "
          "$MOESH_API_KEY (its first line), else none.");
ABSL_FLAG(std::string, expert_device, "",
          "--device of the expert workers when not the others' (cuda:1: attention on one GPU, "
          "experts on another), or a comma-separated list they take in turn (cuda:1,cuda:2).");

namespace moesh::cli {

absl::StatusOr<std::string> ModelFlag() {
  std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) return absl::InvalidArgumentError("--model is required");
  return dir;
}

namespace {

// A comma-separated list of token ids, each in [0, INT32_MAX] (what the API's
// int32 ids can carry; never wrapped).
absl::StatusOr<std::vector<int32_t>> TokenIdsFlag(absl::string_view flag, absl::string_view text) {
  ASSIGN_OR_RETURN(std::vector<int64_t> ids, ParseIntList(flag, text));
  std::vector<int32_t> out;
  for (int64_t t : ids) {
    if (t < 0 || t > std::numeric_limits<int32_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", t,
                                                     " is not a token id (ids lie in [0, ",
                                                     std::numeric_limits<int32_t>::max(), "])"));
    }
    out.push_back(static_cast<int32_t>(t));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<int32_t>> PromptIdsFlag() {
  return TokenIdsFlag("prompt_ids", absl::GetFlag(FLAGS_prompt_ids));
}

absl::StatusOr<std::vector<int32_t>> StopTokenIdsFlag() {
  return TokenIdsFlag("stop_token_ids", absl::GetFlag(FLAGS_stop_token_ids));
}

SamplingParams SamplingFromFlags() {
  SamplingParams sp;
  sp.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  sp.top_k = absl::GetFlag(FLAGS_top_k);
  sp.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  sp.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  sp.top_logprobs = absl::GetFlag(FLAGS_top_logprobs);
  if (const std::optional<int> k = absl::GetFlag(FLAGS_logprobs)) {
    sp.logprobs = true;
    sp.top_logprobs = std::max(sp.top_logprobs, *k);
  }
  sp.prompt_logprobs = absl::GetFlag(FLAGS_prompt_logprobs).value_or(-1);
  sp.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  sp.presence_penalty = static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  sp.frequency_penalty = static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  sp.seed = absl::GetFlag(FLAGS_seed);
  return sp;
}

absl::StatusOr<SamplingParams> BenchSamplingFromFlags(int vocab) {
  SamplingParams sp = SamplingFromFlags();  // greedy unless --temperature
  if (sp.top_logprobs > 0) {
    return absl::InvalidArgumentError(
        "--logprobs: moesh bench takes 0 only (each token's own log-probability, as the HTTP rows "
        "ask it)");
  }
  RETURN_IF_ERROR(sp.Validate(vocab));
  return sp;
}

absl::StatusOr<int> NFlag() {
  const int n = absl::GetFlag(FLAGS_n);
  if (n < 1) return absl::InvalidArgumentError(absl::StrCat("--n must be >= 1, got ", n));
  return n;
}

std::string BinDirFlag() {
  const std::string dir = absl::GetFlag(FLAGS_bin_dir);
  if (!dir.empty()) return dir;
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  const std::string bin = len > 0 ? std::string(self, len) : "./moesh";
  return bin.substr(0, bin.rfind('/'));
}

std::string ApiKeyFlag() {
  std::string key = absl::GetFlag(FLAGS_api_key);
  if (const char* env = std::getenv("MOESH_API_KEY"); key.empty() && env != nullptr) key = env;
  // A key file's content (a Kubernetes Secret as an environment variable): its first line.
  key = key.substr(0, key.find('\n'));
  return std::string(absl::StripAsciiWhitespace(key));
}

absl::Status SetWorkerMemoryFromFlags(LocalClusterOptions* o) {
  const double decode = absl::GetFlag(FLAGS_decode_gpu_memory_utilization);
  const double prefill = absl::GetFlag(FLAGS_prefill_gpu_memory_utilization);
  if (!(decode > 0 && decode <= 1) || !(prefill > 0 && prefill <= 1) || prefill <= decode) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--decode_gpu_memory_utilization (", decode, ") and --prefill_gpu_memory_utilization (",
        prefill,
        ") must lie in (0, 1], the prefill share above the decode share (it starts where the "
        "decode workers' ends)"));
  }
  o->decode.device.gpu_memory_utilization = decode;
  o->prefill.device.gpu_memory_utilization = prefill;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ExpertDevicesFlag() {
  const std::string list = absl::GetFlag(FLAGS_expert_device);
  if (list.empty()) return std::vector<std::string>();
  std::vector<std::string> devices = absl::StrSplit(list, ',');
  for (const std::string& d : devices) {
    if (d.empty()) return absl::InvalidArgumentError("--expert_device: an empty entry in the list");
  }
  return devices;
}

}  // namespace moesh::cli
