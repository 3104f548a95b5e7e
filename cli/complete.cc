// moesh complete: a streaming client of the public Generation API.
#include <grpcpp/grpcpp.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/base/status.h"
#include "common/rpc/grpc_util.h"
#include "common/service/sampling_proto.h"
#include "moesh/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"

namespace moesh::cli {

absl::Status RunComplete(const std::vector<std::string>& argv) {
  ASSIGN_OR_RETURN(
      Args args,
      Args::Parse(argv,
                  {"server", "prompt", "prompt-ids", "max-new-tokens", "temperature", "top-k",
                   "top-p", "min-p", "seed", "top-logprobs", "stop-token-ids", "stop", "timeout",
                   "request-id", "repetition-penalty", "presence-penalty", "frequency-penalty"},
                  {"ignore-eos", "json"}));
  ASSIGN_OR_RETURN(std::string server, args.Required("server"));
  v1::GenerateRequest req;
  if (auto id = args.Get("request-id")) req.set_request_id(*id);
  if (auto text = args.Get("prompt")) {
    req.set_text(*text);
  } else {
    ASSIGN_OR_RETURN(std::vector<int64_t> ids, args.IntList("prompt-ids"));
    if (ids.empty()) return absl::InvalidArgumentError("--prompt or --prompt-ids is required");
    for (int64_t t : ids) req.mutable_token_ids()->add_ids(static_cast<int32_t>(t));
  }
  // The CLI defaults to greedy, as `moesh generate` does.
  ASSIGN_OR_RETURN(const SamplingParams sp, SamplingFromFlags(args));
  SamplingToProto(sp, req.mutable_sampling());
  v1::StopConditions* stop = req.mutable_stop();
  if (args.Has("max-new-tokens")) {
    ASSIGN_OR_RETURN(int64_t v, args.Int("max-new-tokens", 16));
    stop->set_max_new_tokens(static_cast<int>(v));
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> stop_ids, args.IntList("stop-token-ids"));
  for (int64_t t : stop_ids) stop->add_stop_token_ids(static_cast<int32_t>(t));
  if (auto s = args.Get("stop")) stop->add_stop_strings(*s);
  stop->set_ignore_eos(args.Bool("ignore-eos"));

  auto stub =
      v1::Generation::NewStub(grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ASSIGN_OR_RETURN(double timeout, args.Double("timeout", 600));
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000)));
  auto reader = stub->Generate(&ctx, req);
  const bool json = args.Bool("json");
  v1::GenerateResponse m;
  nlohmann::json out = {{"output_ids", nlohmann::json::array()},
                        {"top_logprobs", nlohmann::json::array()}};
  std::string text;
  v1::FinalInfo fin;
  while (reader->Read(&m)) {
    for (int32_t t : m.token_ids()) out["output_ids"].push_back(t);
    for (const auto& lp : m.logprobs()) {
      nlohmann::json row = nlohmann::json::array();
      for (const auto& c : lp.candidates())
        row.push_back({{"id", c.id()}, {"logprob", c.logprob()}});
      out["top_logprobs"].push_back(row);
    }
    text += m.text();
    if (!json) {
      if (!m.text().empty()) {
        std::cout << m.text() << std::flush;
      } else if (req.prompt_case() == v1::GenerateRequest::kTokenIds) {
        for (int32_t t : m.token_ids()) std::cout << t << " " << std::flush;
      }
    }
    if (m.has_final()) fin = m.final();
  }
  RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  const char* reason = fin.finish_reason() == v1::FINISH_REASON_STOP    ? "stop"
                       : fin.finish_reason() == v1::FINISH_REASON_ABORT ? "abort"
                                                                        : "length";
  if (json) {
    out["finish_reason"] = reason;
    out["text"] = text;
    out["usage"] = {{"prompt_tokens", fin.usage().prompt_tokens()},
                    {"completion_tokens", fin.usage().completion_tokens()}};
    out["time_to_first_token_seconds"] = fin.timings().time_to_first_token_seconds();
    std::cout << out.dump() << std::endl;
  } else {
    std::cout << "\n[" << reason << ", " << fin.usage().completion_tokens() << " tokens, ttft "
              << fin.timings().time_to_first_token_seconds() * 1e3 << " ms]" << std::endl;
  }
  return absl::OkStatus();
}

}  // namespace moesh::cli
