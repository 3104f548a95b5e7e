// OpenAiResponder: the Generate stream as OpenAI's response objects and
// Server-Sent Event chunks (router/openai_api.h).
#include "absl/strings/str_cat.h"
#include "router/openai_api.h"

namespace moesh {
namespace {

using Json = nlohmann::json;

const char* FinishReason(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_LENGTH:
      return "length";
    case v1::FINISH_REASON_STOP:
      return "stop";
    case v1::FINISH_REASON_ABORT:
      return "abort";
    case v1::FINISH_REASON_UNSPECIFIED:
    case v1::FinishReason_INT_MIN_SENTINEL_DO_NOT_USE_:
    case v1::FinishReason_INT_MAX_SENTINEL_DO_NOT_USE_:
      break;
  }
  return "stop";
}

std::string Event(const Json& j) { return absl::StrCat("data: ", DumpJson(j), "\n\n"); }

Json Bytes(const std::string& s) {
  Json b = Json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

std::string DumpJson(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

OpenAiResponder::OpenAiResponder(const OpenAiRequest& request, std::string id, std::string model,
                                 int64_t created, std::function<std::string(int32_t)> decode_token)
    : request_(request),
      id_(std::move(id)),
      model_(std::move(model)),
      created_(created),
      decode_token_(std::move(decode_token)),
      logprobs_(EmptyLogprobs()) {}

Json OpenAiResponder::EmptyLogprobs() const {
  if (request_.chat) return Json{{"content", Json::array()}};
  return Json{{"tokens", Json::array()},
              {"token_logprobs", Json::array()},
              {"top_logprobs", Json::array()}};
}

Json OpenAiResponder::ChunkBase() const {
  return Json{{"id", id_},
              {"object", request_.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", model_}};
}

Json OpenAiResponder::Usage(const v1::FinalInfo& f) const {
  const v1::Usage& u = f.usage();
  return Json{{"prompt_tokens", u.prompt_tokens()},
              {"completion_tokens", u.completion_tokens()},
              {"total_tokens", u.prompt_tokens() + u.completion_tokens()},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens()}}}};
}

// The sampled token's log-probability is the one of its entry among the
// alternatives the engines report; null where it is not among them (sampling
// picked a token outside the top ones), which only a larger top_logprobs
// avoids (the engines do not return it apart yet).
void OpenAiResponder::AddLogprobs(const v1::GenerateResponse& m, Json* into) const {
  for (int i = 0; i < m.token_ids_size(); ++i) {
    const int32_t id = m.token_ids(i);
    Json sampled;  // null unless found
    Json alternatives = request_.chat ? Json::array() : Json::object();
    if (i < m.logprobs_size()) {
      const v1::TopLogprobs& top = m.logprobs(i);
      for (int k = 0; k < top.candidates_size(); ++k) {
        const v1::TokenLogprob& c = top.candidates(k);
        if (c.id() == id) sampled = c.logprob();
        if (k >= request_.top_logprobs) continue;
        const std::string text = decode_token_(c.id());
        if (request_.chat) {
          alternatives.push_back(
              {{"token", text}, {"logprob", c.logprob()}, {"bytes", Bytes(text)}});
        } else {
          alternatives[text] = c.logprob();
        }
      }
    }
    const std::string text = decode_token_(id);
    if (request_.chat) {
      (*into)["content"].push_back({{"token", text},
                                    {"logprob", sampled},
                                    {"bytes", Bytes(text)},
                                    {"top_logprobs", alternatives}});
    } else {
      (*into)["tokens"].push_back(text);
      (*into)["token_logprobs"].push_back(sampled);
      (*into)["top_logprobs"].push_back(alternatives);
    }
  }
}

std::string OpenAiResponder::StreamEvents(const v1::GenerateResponse& m) {
  std::string out;
  const bool chat = request_.chat;
  auto chunk = [&](Json choice) {
    Json c = ChunkBase();
    c["choices"] = Json::array({std::move(choice)});
    if (request_.include_usage) c["usage"] = nullptr;
    out += Event(c);
  };
  if (chat && !role_sent_) {
    role_sent_ = true;
    chunk({{"index", 0},
           {"delta", {{"role", "assistant"}, {"content", ""}}},
           {"logprobs", nullptr},
           {"finish_reason", nullptr}});
  }
  const bool with_logprobs = request_.logprobs && m.token_ids_size() > 0;
  if (!m.text().empty() || with_logprobs) {
    Json lp;
    if (with_logprobs) {
      lp = EmptyLogprobs();
      AddLogprobs(m, &lp);
    }
    Json choice = {{"index", 0}, {"logprobs", lp}, {"finish_reason", nullptr}};
    if (chat) {
      choice["delta"] = {{"content", m.text()}};
    } else {
      choice["text"] = m.text();
    }
    chunk(std::move(choice));
  }
  if (m.has_final()) {
    Json choice = {{"index", 0},
                   {"logprobs", nullptr},
                   {"finish_reason", FinishReason(m.final().finish_reason())}};
    if (chat) {
      choice["delta"] = Json::object();
    } else {
      choice["text"] = "";
    }
    chunk(std::move(choice));
    if (request_.include_usage) {
      Json c = ChunkBase();
      c["choices"] = Json::array();
      c["usage"] = Usage(m.final());
      out += Event(c);
    }
    out += "data: [DONE]\n\n";
  }
  return out;
}

void OpenAiResponder::Add(const v1::GenerateResponse& m) {
  text_ += m.text();
  if (request_.logprobs) AddLogprobs(m, &logprobs_);
  if (m.has_final()) final_ = m.final();
}

std::string OpenAiResponder::Body() const {
  Json choice = {{"index", 0},
                 {"logprobs", request_.logprobs ? logprobs_ : Json()},
                 {"finish_reason", FinishReason(final_.finish_reason())}};
  if (request_.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text_}};
  } else {
    choice["text"] = text_;
  }
  Json body = ChunkBase();
  body["object"] = request_.chat ? "chat.completion" : "text_completion";
  body["choices"] = Json::array({std::move(choice)});
  body["usage"] = Usage(final_);
  return DumpJson(body);
}

std::string OpenAiResponder::StreamError(const absl::Status& status) {
  return absl::StrCat("data: ", ToHttpError(status).body, "\n\n");
}

}  // namespace moesh
