// moesh generate: offline generation from a model directory.
#include "common/engine/generate.h"

#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/backend/backends.h"
#include "common/base/status.h"
#include "common/model/model.h"
#include "common/model/safetensors.h"
#include "nlohmann/json.hpp"

namespace moesh::cli {

absl::StatusOr<SamplingParams> SamplingFromFlags(const Args& args) {
  SamplingParams sp;
  ASSIGN_OR_RETURN(double temperature, args.Double("temperature", 0.0));
  ASSIGN_OR_RETURN(int64_t top_k, args.Int("top-k", 0));
  ASSIGN_OR_RETURN(double top_p, args.Double("top-p", 1.0));
  ASSIGN_OR_RETURN(double min_p, args.Double("min-p", 0.0));
  ASSIGN_OR_RETURN(int64_t top_logprobs, args.Int("top-logprobs", 0));
  sp.temperature = static_cast<float>(temperature);
  sp.top_k = static_cast<int>(top_k);
  sp.top_p = static_cast<float>(top_p);
  sp.min_p = static_cast<float>(min_p);
  sp.top_logprobs = static_cast<int>(top_logprobs);
  ASSIGN_OR_RETURN(double repetition, args.Double("repetition-penalty", 1.0));
  ASSIGN_OR_RETURN(double presence, args.Double("presence-penalty", 0.0));
  ASSIGN_OR_RETURN(double frequency, args.Double("frequency-penalty", 0.0));
  sp.repetition_penalty = static_cast<float>(repetition);
  sp.presence_penalty = static_cast<float>(presence);
  sp.frequency_penalty = static_cast<float>(frequency);
  if (args.Has("seed")) {
    ASSIGN_OR_RETURN(int64_t seed, args.Int("seed", 0));
    sp.seed = static_cast<uint64_t>(seed);
  }
  return sp;
}

absl::Status RunGenerate(const std::vector<std::string>& argv) {
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argv,
                  {"model", "prompt-ids", "max-new-tokens", "temperature", "top-k", "top-p",
                   "min-p", "seed", "top-logprobs", "stop-token-ids", "repetition-penalty",
                   "presence-penalty", "frequency-penalty", "device", "gpu-memory-utilization"},
                  {"ignore-eos", "json"}));
  ASSIGN_OR_RETURN(std::string dir, args.Required("model"));
  ASSIGN_OR_RETURN(std::vector<int64_t> prompt64, args.IntList("prompt-ids"));
  if (prompt64.empty())
    return absl::InvalidArgumentError("--prompt-ids is required (e.g. --prompt-ids 5,17,300)");
  std::vector<int32_t> prompt;
  for (int64_t t : prompt64) {
    if (t < INT32_MIN || t > INT32_MAX)
      return absl::InvalidArgumentError(absl::StrCat("token id ", t, " is out of range"));
    prompt.push_back(static_cast<int32_t>(t));
  }
  StopParams stop;
  ASSIGN_OR_RETURN(int64_t max_new, args.Int("max-new-tokens", 16));
  stop.max_new_tokens = static_cast<int>(std::min<int64_t>(max_new, INT32_MAX));
  stop.ignore_eos = args.Bool("ignore-eos");
  ASSIGN_OR_RETURN(std::vector<int64_t> stops, args.IntList("stop-token-ids"));
  for (int64_t s : stops) stop.stop_token_ids.push_back(static_cast<int32_t>(s));
  ASSIGN_OR_RETURN(const SamplingParams sp, SamplingFromFlags(args));

  DeviceOptions device;
  device.device = args.Get("device").value_or("cpu");
  RETURN_IF_ERROR(ValidateDevice(device.device));
  ASSIGN_OR_RETURN(device.gpu_memory_utilization, args.Double("gpu-memory-utilization", 0.9));
  GenerationResult r;
  if (IsCudaDevice(device.device)) {
    // One sequence: the whole model, experts included, on the device.
    device.max_num_seqs = 1;
    const int64_t need = static_cast<int64_t>(prompt.size()) + stop.max_new_tokens - 1;
    device.max_model_len = need > 8192 ? static_cast<int>(std::min<int64_t>(need, INT32_MAX)) : 0;
    ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
    ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
    RETURN_IF_ERROR(ValidateCheckpoint(config, *ckpt));
    ASSIGN_OR_RETURN(std::unique_ptr<AttentionBackend> backend,
                     MakeAttentionBackend(config, ckpt.get(), device, /*with_experts=*/true));
    ASSIGN_OR_RETURN(r, Generate(backend.get(), nullptr, prompt, sp, stop));
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(dir));
    ASSIGN_OR_RETURN(r, Generate(*model, prompt, sp, stop));
  }

  if (args.Bool("json")) {
    nlohmann::json j;
    j["output_ids"] = r.output_ids;
    nlohmann::json lps = nlohmann::json::array();
    for (const auto& step : r.top_logprobs) {
      nlohmann::json row = nlohmann::json::array();
      for (const TokenLogprob& t : step) row.push_back({{"id", t.id}, {"logprob", t.logprob}});
      lps.push_back(row);
    }
    j["top_logprobs"] = lps;
    j["finish_reason"] = FinishReasonName(r.finish_reason);
    j["usage"] = {{"prompt_tokens", r.prompt_tokens}, {"completion_tokens", r.output_ids.size()}};
    std::cout << j.dump() << std::endl;
    return absl::OkStatus();
  }
  std::cout << "prompt (" << prompt.size() << " tokens): " << absl::StrJoin(prompt, " ") << "\n";
  std::cout << "output (" << r.output_ids.size() << " tokens): " << absl::StrJoin(r.output_ids, " ")
            << "\n";
  std::cout << "finish reason: " << FinishReasonName(r.finish_reason) << "\n";
  for (size_t i = 0; i < r.top_logprobs.size(); ++i) {
    std::cout << "  step " << i << ":";
    for (const TokenLogprob& t : r.top_logprobs[i]) std::printf(" %d(%.4f)", t.id, t.logprob);
    std::cout << "\n";
  }
  return absl::OkStatus();
}

}  // namespace moesh::cli
