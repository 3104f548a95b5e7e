// moesh generate: offline generation from a model directory.
#include "common/engine/generate.h"

#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "common/backend/backends.h"
#include "common/engine/attention_backend.h"
#include "common/model/model.h"
#include "common/model/safetensors.h"
#include "common/service/device_flags.h"
#include "nlohmann/json.hpp"

namespace moesh::cli {
namespace {

// --json's prompt_logprobs: {"logprobs": [...], "top_logprobs": [[{id, logprob}]]}.
nlohmann::json PromptLogprobsJson(const PromptLogprobs& p) {
  nlohmann::json top = nlohmann::json::array();
  for (const auto& row : p.top) {
    nlohmann::json r = nlohmann::json::array();
    for (const TokenLogprob& t : row) r.push_back({{"id", t.id}, {"logprob", t.logprob}});
    top.push_back(r);
  }
  return {{"logprobs", p.logprobs}, {"top_logprobs", top}};
}

}  // namespace

absl::Status RunGenerate() {
  ASSIGN_OR_RETURN(const std::string dir, ModelFlag());
  ASSIGN_OR_RETURN(const std::vector<int32_t> prompt, PromptIdsFlag());
  if (prompt.empty())
    return absl::InvalidArgumentError("--prompt_ids is required (e.g. --prompt_ids=5,17,300)");
  StopParams stop;
  stop.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens).value_or(16);
  stop.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  ASSIGN_OR_RETURN(stop.stop_token_ids, StopTokenIdsFlag());
  const SamplingParams sp = SamplingFromFlags();

  // --device, --gpu_memory_utilization, --max_model_len
  // (common/service/device_flags.cc).
  ASSIGN_OR_RETURN(DeviceOptions device, DeviceOptionsFromFlags());
  ASSIGN_OR_RETURN(const int n, NFlag());
  // --n: sibling generations, sibling i seeded seed + i (as the router's n).
  std::vector<GenerationResult> results(n);
  std::unique_ptr<AttentionBackend> backend;
  std::unique_ptr<Model> model;
  if (IsCudaDevice(device.device)) {
    // One sequence: the whole model, experts included, on the device.
    device.max_num_seqs = 1;
    if (device.max_model_len == 0) {  // room for this prompt and output
      const int64_t need = static_cast<int64_t>(prompt.size()) + stop.max_new_tokens - 1;
      device.max_model_len = need > 8192 ? static_cast<int>(std::min<int64_t>(need, INT32_MAX)) : 0;
    }
    ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
    ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
    RETURN_IF_ERROR(ValidateCheckpoint(config, *ckpt));
    ASSIGN_OR_RETURN(backend,
                     MakeAttentionBackend(config, ckpt.get(), device, /*with_experts=*/true));
  } else {  // the CPU engine, its KV rows as --kv_cache_dtype says
    ASSIGN_OR_RETURN(model, Model::Load(dir));
    ASSIGN_OR_RETURN(const KvRowFormat kv_format, KvRowFormatFor(model->config(), device));
    backend = NewCpuAttentionBackend(&model->attention(), 0, 1, false, kv_format);
  }
  ExpertClient* experts = model != nullptr ? model->experts() : nullptr;
  for (int i = 0; i < n; ++i) {
    SamplingParams spi = sp;
    if (spi.seed.has_value()) *spi.seed += static_cast<uint64_t>(i);
    ASSIGN_OR_RETURN(results[i], Generate(backend.get(), experts, prompt, spi, stop));
  }

  const bool json = absl::GetFlag(FLAGS_json);
  if (!json)
    std::cout << "prompt (" << prompt.size() << " tokens): " << absl::StrJoin(prompt, " ") << "\n";
  for (int i = 0; i < n; ++i) {
    const GenerationResult& r = results[i];
    if (json) {  // one object per choice, a line each
      nlohmann::json j;
      if (n > 1) j["index"] = i;
      j["output_ids"] = r.output_ids;
      nlohmann::json lps = nlohmann::json::array();
      for (const auto& step : r.top_logprobs) {
        nlohmann::json row = nlohmann::json::array();
        for (const TokenLogprob& t : step) row.push_back({{"id", t.id}, {"logprob", t.logprob}});
        lps.push_back(row);
      }
      j["top_logprobs"] = lps;
      if (sp.wants_logprob()) j["logprobs"] = r.logprobs;
      if (sp.prompt_logprobs >= 0) j["prompt_logprobs"] = PromptLogprobsJson(r.prompt_logprobs);
      j["finish_reason"] = FinishReasonName(r.finish_reason);
      j["usage"] = {{"prompt_tokens", i == 0 ? r.prompt_tokens : 0},
                    {"completion_tokens", r.output_ids.size()}};
      std::cout << j.dump() << std::endl;
      continue;
    }
    if (i == 0 && sp.prompt_logprobs >= 0) {
      std::cout << "prompt logprobs (of tokens 1..):";
      for (float lp : r.prompt_logprobs.logprobs) std::printf(" %.4f", lp);
      std::cout << "\n";
    }
    if (n > 1) std::cout << "choice " << i << ":\n";
    std::cout << "output (" << r.output_ids.size()
              << " tokens): " << absl::StrJoin(r.output_ids, " ") << "\n";
    std::cout << "finish reason: " << FinishReasonName(r.finish_reason) << "\n";
    for (size_t k = 0; k < r.output_ids.size(); ++k) {
      if (k >= r.logprobs.size() && k >= r.top_logprobs.size()) break;
      std::cout << "  step " << k << ": " << r.output_ids[k];
      if (k < r.logprobs.size()) std::printf(" logprob %.4f", r.logprobs[k]);
      if (k < r.top_logprobs.size()) {
        std::cout << " top:";
        for (const TokenLogprob& t : r.top_logprobs[k]) std::printf(" %d(%.4f)", t.id, t.logprob);
      }
      std::cout << "\n";
    }
  }
  return absl::OkStatus();
}

}  // namespace moesh::cli
