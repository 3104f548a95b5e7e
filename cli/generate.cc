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
#include "common/model/model.h"
#include "common/model/safetensors.h"
#include "common/service/device_flags.h"
#include "nlohmann/json.hpp"

namespace moesh::cli {

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
  GenerationResult r;
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
    ASSIGN_OR_RETURN(std::unique_ptr<AttentionBackend> backend,
                     MakeAttentionBackend(config, ckpt.get(), device, /*with_experts=*/true));
    ASSIGN_OR_RETURN(r, Generate(backend.get(), nullptr, prompt, sp, stop));
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<Model> model, Model::Load(dir));
    ASSIGN_OR_RETURN(r, Generate(*model, prompt, sp, stop));
  }

  if (absl::GetFlag(FLAGS_json)) {
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
