// moesh complete: a streaming client of the public Generation API.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_util.h"
#include "base/status.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "common/rpc/grpc_util.h"
#include "common/service/sampling_proto.h"
#include "moesh/v1/generation.grpc.pb.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, server, "",
          "The router's address, host:port; or several, comma-separated (router HA): a request "
          "that fails UNAVAILABLE before its first token (a router down or draining) is tried "
          "on the next one.");
ABSL_FLAG(std::string, prompt, "",
          "The prompt as text (the router tokenizes it; or --prompt_ids).");
ABSL_FLAG(std::string, stop, "", "A string that ends generation.");
ABSL_FLAG(double, timeout, 600, "Seconds the request may take.");
ABSL_FLAG(std::string, request_id, "", "The request's id (default: the router picks one).");
ABSL_FLAG(std::string, server_ca, "",
          "A CA certificate file (PEM): connect with TLS (a router with --public_tls), checking "
          "the router's certificate against it; empty: plaintext.");

namespace moesh::cli {
namespace {

// [{"id", "logprob"}] of one position's candidates.
nlohmann::json CandidatesJson(const v1::TopLogprobs& top) {
  nlohmann::json row = nlohmann::json::array();
  for (const auto& c : top.candidates()) row.push_back({{"id", c.id()}, {"logprob", c.logprob()}});
  return row;
}

}  // namespace

absl::Status RunComplete() {
  const std::vector<std::string> servers =
      absl::StrSplit(absl::GetFlag(FLAGS_server), ',', absl::SkipWhitespace());
  if (servers.empty()) return absl::InvalidArgumentError("--server is required");
  v1::GenerateRequest req;
  if (const std::string id = absl::GetFlag(FLAGS_request_id); !id.empty()) req.set_request_id(id);
  ASSIGN_OR_RETURN(const std::vector<int32_t> ids, PromptIdsFlag());
  const std::string prompt = absl::GetFlag(FLAGS_prompt);
  if (!prompt.empty() && !ids.empty()) {
    return absl::InvalidArgumentError("--prompt and --prompt_ids exclude each other: give one");
  }
  if (!prompt.empty()) {
    req.set_text(prompt);
  } else {
    if (ids.empty()) return absl::InvalidArgumentError("--prompt or --prompt_ids is required");
    req.mutable_token_ids()->mutable_ids()->Add(ids.begin(), ids.end());
  }
  // The CLI defaults to greedy, as `moesh generate` does.
  SamplingToProto(SamplingFromFlags(), req.mutable_sampling());
  ASSIGN_OR_RETURN(const int n, NFlag());
  req.set_n(n);
  v1::StopConditions* stop = req.mutable_stop();
  if (const std::optional<int> n = absl::GetFlag(FLAGS_max_new_tokens)) {
    stop->set_max_new_tokens(*n);
  }
  ASSIGN_OR_RETURN(const std::vector<int32_t> stop_ids, StopTokenIdsFlag());
  for (int32_t t : stop_ids) stop->add_stop_token_ids(t);
  if (const std::string s = absl::GetFlag(FLAGS_stop); !s.empty()) stop->add_stop_strings(s);
  stop->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));

  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (const std::string ca = absl::GetFlag(FLAGS_server_ca); !ca.empty()) {
    absl::StatusOr<std::string> pem = ReadFileToString(ca);
    if (!pem.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--server_ca: ", pem.status().message()));
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = *pem;
    credentials = grpc::SslCredentials(ssl);
  }
  const std::string api_key = ApiKeyFlag();
  const double timeout = absl::GetFlag(FLAGS_timeout);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000));
  const bool json = absl::GetFlag(FLAGS_json);
  v1::GenerateResponse m;
  // Per choice (GenerateResponse.index; one unless --n).
  std::vector<nlohmann::json> outs(
      n, {{"output_ids", nlohmann::json::array()}, {"top_logprobs", nlohmann::json::array()}});
  std::vector<std::string> texts(n);
  std::vector<v1::FinalInfo> fins(n);
  // The routers in turn until one takes the request: nothing was streamed
  // before an UNAVAILABLE, so the next router runs it from the start. A
  // stream that breaks after its first message is not retried (its tokens
  // were printed): a router's death fails its own streams.
  for (size_t attempt = 0; attempt < servers.size(); ++attempt) {
    const std::string& server = servers[attempt];
    auto stub = v1::Generation::NewStub(grpc::CreateChannel(server, credentials));
    grpc::ClientContext ctx;
    if (!api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + api_key);
    ctx.set_deadline(deadline);
    auto reader = stub->Generate(&ctx, req);
    int messages = 0;
    while (reader->Read(&m)) {
      ++messages;
      const int i = std::clamp(m.index(), 0, n - 1);
      nlohmann::json& out = outs[i];
      for (int32_t t : m.token_ids()) out["output_ids"].push_back(t);
      for (const auto& lp : m.logprobs()) out["top_logprobs"].push_back(CandidatesJson(lp));
      for (float lp : m.token_logprobs()) out["logprobs"].push_back(lp);
      if (m.has_prompt_logprobs()) {
        nlohmann::json top = nlohmann::json::array();
        for (const auto& row : m.prompt_logprobs().top()) top.push_back(CandidatesJson(row));
        out["prompt_logprobs"] = {
            {"logprobs", std::vector<float>(m.prompt_logprobs().logprobs().begin(),
                                            m.prompt_logprobs().logprobs().end())},
            {"top_logprobs", top}};
        if (!json) {
          std::cout << "[prompt logprobs (of tokens 1..):";
          for (float lp : m.prompt_logprobs().logprobs()) std::cout << " " << lp;
          std::cout << "]\n";
        }
      }
      texts[i] += m.text();
      if (!json && n == 1) {  // streamed as it comes; n > 1: each choice at its end
        if (!m.text().empty()) {
          std::cout << m.text() << std::flush;
        } else if (req.prompt_case() == v1::GenerateRequest::kTokenIds) {
          for (int32_t t : m.token_ids()) std::cout << t << " " << std::flush;
        }
        for (float lp : m.token_logprobs()) std::cout << "(" << lp << ") " << std::flush;
      }
      if (m.has_final()) fins[i] = m.final();
    }
    const grpc::Status status = reader->Finish();
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE && messages == 0 &&
        attempt + 1 < servers.size()) {
      std::cerr << "router " << server << " unavailable (" << status.error_message() << "); trying "
                << servers[attempt + 1] << std::endl;
      continue;
    }
    if (!status.ok() && messages > 0) {
      return absl::Status(FromGrpcStatus(status).code(),
                          absl::StrCat("the stream from router ", server, " broke after ", messages,
                                       " messages (a router's death fails its streams; run the "
                                       "request again): ",
                                       status.error_message()));
    }
    RETURN_IF_ERROR(FromGrpcStatus(status));
    break;
  }
  for (int i = 0; i < n; ++i) {
    const v1::FinalInfo& fin = fins[i];
    const char* reason = fin.finish_reason() == v1::FINISH_REASON_STOP    ? "stop"
                         : fin.finish_reason() == v1::FINISH_REASON_ABORT ? "abort"
                                                                          : "length";
    if (json) {  // one object per choice, a line each
      nlohmann::json& out = outs[i];
      if (n > 1) out["index"] = i;
      out["finish_reason"] = reason;
      out["text"] = texts[i];
      out["usage"] = {{"prompt_tokens", fin.usage().prompt_tokens()},
                      {"completion_tokens", fin.usage().completion_tokens()},
                      {"cached_tokens", fin.usage().cached_tokens()}};
      out["time_to_first_token_seconds"] = fin.timings().time_to_first_token_seconds();
      std::cout << out.dump() << std::endl;
      continue;
    }
    if (n > 1) {
      std::cout << "choice " << i << ": " << texts[i];
      if (texts[i].empty()) {
        for (int32_t t : outs[i]["output_ids"]) std::cout << t << " ";
      }
      if (outs[i].contains("logprobs")) std::cout << " logprobs " << outs[i]["logprobs"].dump();
    }
    std::cout << "\n[" << reason << ", " << fin.usage().completion_tokens() << " tokens, ttft "
              << fin.timings().time_to_first_token_seconds() * 1e3 << " ms]" << std::endl;
  }
  return absl::OkStatus();
}

}  // namespace moesh::cli
