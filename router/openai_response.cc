// OpenAiResponder: the Generate stream as OpenAI's response objects and
// Server-Sent Event chunks (router/openai_api.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "router/openai_api.h"

namespace moesh {
namespace {

// Appends a call's piece to `calls`: a new call, or more arguments of one
// already there (ChatDelta's pieces).
void AppendCall(ParsedToolCall piece, std::vector<ParsedToolCall>* calls) {
  for (ParsedToolCall& c : *calls) {
    if (c.index == piece.index) {
      c.arguments += piece.arguments;
      return;
    }
  }
  calls->push_back(std::move(piece));
}

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
      choices_(std::max(request.n, 1)) {
  // A chunk's fields after "choices", as DumpJson orders them (keys sorted).
  const std::string base = DumpJson(ChunkBase());  // {"created":..,"object":..}
  chunk_tail_ = absl::StrCat(",", base.substr(1, base.size() - 2),
                             request_.include_usage ? ",\"usage\":null" : "", "}\n\n");
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& c = choices_[i];
    c.logprobs = EmptyLogprobs();
    if (!request_.chat) continue;
    ChatOutputParser::Options o = request_.output;
    o.id_prefix = absl::StrCat("call_", id_, "_", i, "_");
    c.parser = std::make_unique<ChatOutputParser>(std::move(o));
    // The text the prompt opened the turn with is the parser's, not the client's.
    if (!request_.forced_output.empty()) {
      c.forced_calls = c.parser->Feed(request_.forced_output).tool_calls;
    }
  }
}

Json OpenAiResponder::Delta(const ChatDelta& d) {
  Json delta = Json::object();
  if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.tool_calls.empty()) {
    Json calls = Json::array();
    for (const ParsedToolCall& t : d.tool_calls) {
      if (t.id.empty()) {  // more of a call's arguments
        calls.push_back({{"index", t.index}, {"function", {{"arguments", t.arguments}}}});
        continue;
      }
      calls.push_back({{"index", t.index},
                       {"id", t.id},
                       {"type", "function"},
                       {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
    }
    delta["tool_calls"] = std::move(calls);
  }
  return delta;
}

const char* OpenAiResponder::ChatFinishReason(const Choice& c) {
  if (c.final.finish_reason() == v1::FINISH_REASON_STOP && c.parser != nullptr &&
      c.parser->tool_calls() > 0) {
    return "tool_calls";
  }
  return FinishReason(c.final.finish_reason());
}

Json OpenAiResponder::EmptyLogprobs() const {
  if (request_.chat) return Json{{"content", Json::array()}};
  return Json{{"tokens", Json::array()},
              {"token_logprobs", Json::array()},
              {"top_logprobs", Json::array()},
              {"text_offset", Json::array()}};
}

std::string OpenAiResponder::PromptText() const {
  const v1::GenerateRequest& g = request_.generate;
  if (g.prompt_case() == v1::GenerateRequest::kText) return g.text();
  std::string text;
  for (int32_t id : g.token_ids().ids()) text += decode_token_(id);
  return text;
}

Json OpenAiResponder::ChunkBase() const {
  return Json{{"id", id_},
              {"object", request_.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", model_}};
}

Json OpenAiResponder::Usage() const {
  int prompt = 0, completion = 0, cached = 0;
  for (const Choice& c : choices_) {  // siblings but the first say 0 prompt tokens
    prompt += c.final.usage().prompt_tokens();
    completion += c.final.usage().completion_tokens();
    cached += c.final.usage().cached_tokens();
  }
  return Json{{"prompt_tokens", prompt},
              {"completion_tokens", completion},
              {"total_tokens", prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

void OpenAiResponder::AddEntry(int32_t id, const Json& logprob, const v1::TopLogprobs* top,
                               Choice* c, Json* into) const {
  Json alternatives = request_.chat ? Json::array() : Json::object();
  auto name = [&](int32_t token) {
    return request_.tokens_as_ids ? absl::StrCat("token_id:", token) : decode_token_(token);
  };
  for (int k = 0; top != nullptr && k < top->candidates_size() && k < request_.top_logprobs; ++k) {
    const v1::TokenLogprob& t = top->candidates(k);
    const std::string text = name(t.id());
    if (request_.chat) {
      alternatives.push_back({{"token", text}, {"logprob", t.logprob()}, {"bytes", Bytes(text)}});
    } else {
      alternatives[text] = t.logprob();
    }
  }
  const std::string text = name(id);
  if (request_.chat) {
    (*into)["content"].push_back({{"token", text},
                                  {"logprob", logprob},
                                  {"bytes", Bytes(text)},
                                  {"top_logprobs", alternatives}});
  } else {
    (*into)["tokens"].push_back(text);
    (*into)["token_logprobs"].push_back(logprob);
    // A prompt's first token has no distribution: null, as OpenAI's echo.
    (*into)["top_logprobs"].push_back(logprob.is_null() ? Json() : alternatives);
    (*into)["text_offset"].push_back(c->text_offset);
    c->text_offset += static_cast<int>(
        (request_.tokens_as_ids ? decode_token_(id) : text).size());  // offsets in the text
  }
}

// Each token's own log-probability is the engine's token_logprobs; an older
// engine that sends none leaves the entry's logprob to its alternatives
// (null where the token is not among them).
void OpenAiResponder::AddLogprobs(const v1::GenerateResponse& m, Choice* c, Json* into) const {
  if (m.has_prompt_logprobs() && request_.echo) {
    const v1::PromptLogprobs& p = m.prompt_logprobs();
    for (int i = 0; i < p.token_ids_size(); ++i) {
      Json lp;  // null for the first token
      if (i > 0 && i - 1 < p.logprobs_size()) lp = p.logprobs(i - 1);
      AddEntry(p.token_ids(i), lp, i > 0 && i - 1 < p.top_size() ? &p.top(i - 1) : nullptr, c,
               into);
    }
  }
  for (int i = 0; i < m.token_ids_size(); ++i) {
    const int32_t id = m.token_ids(i);
    const v1::TopLogprobs* top = i < m.logprobs_size() ? &m.logprobs(i) : nullptr;
    Json sampled;
    if (i < m.token_logprobs_size()) {
      sampled = m.token_logprobs(i);
    } else if (top != nullptr) {
      for (const v1::TokenLogprob& t : top->candidates())
        if (t.id() == id) sampled = t.logprob();
    }
    AddEntry(id, sampled, top, c, into);
  }
}

std::string OpenAiResponder::StreamEvents(const v1::GenerateResponse& m) {
  std::string out;
  const bool chat = request_.chat;
  const int index = std::clamp(m.index(), 0, static_cast<int>(choices_.size()) - 1);
  Choice& c = choices_[index];
  // Event(ChunkBase() + choices [choice] (+ usage null)), byte for byte, with
  // the constant fields dumped once (chunk_tail_).
  auto chunk = [&](const Json& choice) {
    absl::StrAppend(&out, "data: {\"choices\":[", DumpJson(choice), "]", chunk_tail_);
  };
  std::string text = m.text();
  if (!c.started) {
    c.started = true;
    if (chat) {
      chunk({{"index", index},
             {"delta", {{"role", "assistant"}, {"content", ""}}},
             {"logprobs", nullptr},
             {"finish_reason", nullptr}});
    } else if (request_.echo) {
      text = PromptText() + text;
    }
  }
  const bool with_logprobs =
      request_.logprobs && (m.token_ids_size() > 0 || (request_.echo && m.has_prompt_logprobs()));
  // Chat: the text split into reasoning, content and tool calls; what a
  // marker cut across messages holds back comes with a later one.
  Json delta;
  if (chat) {
    ChatDelta d;
    d.tool_calls = std::move(c.forced_calls);
    c.forced_calls.clear();
    ChatDelta fed = c.parser->Feed(text);
    d.reasoning = std::move(fed.reasoning);
    d.content = std::move(fed.content);
    for (ParsedToolCall& t : fed.tool_calls) AppendCall(std::move(t), &d.tool_calls);
    if (m.has_final()) {
      ChatDelta rest = c.parser->Finish();
      d.reasoning += rest.reasoning;
      d.content += rest.content;
      for (ParsedToolCall& t : rest.tool_calls) AppendCall(std::move(t), &d.tool_calls);
    }
    delta = Delta(d);
    if (delta.empty() && with_logprobs) delta["content"] = "";
  }
  if (chat ? !delta.empty() : (!text.empty() || with_logprobs)) {
    Json lp;
    if (with_logprobs) {
      lp = EmptyLogprobs();
      AddLogprobs(m, &c, &lp);
    }
    Json choice = {{"index", index}, {"logprobs", lp}, {"finish_reason", nullptr}};
    if (chat) {
      choice["delta"] = std::move(delta);
    } else {
      choice["text"] = text;
    }
    chunk(std::move(choice));
  }
  if (m.has_final() && !c.done) {
    c.done = true;
    c.final = m.final();
    ++choices_done_;
    Json choice = {
        {"index", index},
        {"logprobs", nullptr},
        {"finish_reason", chat ? ChatFinishReason(c) : FinishReason(c.final.finish_reason())}};
    if (chat) {
      choice["delta"] = Json::object();
    } else {
      choice["text"] = "";
    }
    chunk(std::move(choice));
    if (choices_done_ == static_cast<int>(choices_.size())) {
      if (request_.include_usage) {
        Json j = ChunkBase();
        j["choices"] = Json::array();
        j["usage"] = Usage();
        out += Event(j);
      }
      out += "data: [DONE]\n\n";
    }
  }
  return out;
}

void OpenAiResponder::Add(const v1::GenerateResponse& m) {
  const int index = std::clamp(m.index(), 0, static_cast<int>(choices_.size()) - 1);
  Choice& c = choices_[index];
  if (!c.started) {
    c.started = true;
    if (!request_.chat && request_.echo) c.text = PromptText();
  }
  if (request_.chat) {
    auto take = [&c](ChatDelta d) {
      c.reasoning += d.reasoning;
      c.text += d.content;
      for (ParsedToolCall& t : d.tool_calls) AppendCall(std::move(t), &c.tool_calls);
    };
    if (!c.forced_calls.empty()) {
      ChatDelta forced;
      forced.tool_calls = std::move(c.forced_calls);
      c.forced_calls.clear();
      take(std::move(forced));
    }
    take(c.parser->Feed(m.text()));
    if (m.has_final() && !c.done) {
      c.done = true;
      take(c.parser->Finish());
    }
  } else {
    c.text += m.text();
  }
  if (request_.logprobs) AddLogprobs(m, &c, &c.logprobs);
  if (m.has_final()) c.final = m.final();
}

std::string OpenAiResponder::Body() const {
  Json choices = Json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    Json choice = {{"index", static_cast<int>(i)},
                   {"logprobs", request_.logprobs ? c.logprobs : Json()},
                   {"finish_reason",
                    request_.chat ? ChatFinishReason(c) : FinishReason(c.final.finish_reason())}};
    if (request_.chat) {
      Json message = {{"role", "assistant"}, {"content", c.text}};
      if (request_.output.reasoning) message["reasoning_content"] = c.reasoning;
      if (!c.tool_calls.empty()) {
        ChatDelta calls;
        calls.tool_calls = c.tool_calls;
        message["tool_calls"] = Delta(calls)["tool_calls"];
        if (c.text.empty()) message["content"] = nullptr;  // as OpenAI
      }
      choice["message"] = std::move(message);
    } else {
      choice["text"] = c.text;
    }
    choices.push_back(std::move(choice));
  }
  Json body = ChunkBase();
  body["object"] = request_.chat ? "chat.completion" : "text_completion";
  body["choices"] = std::move(choices);
  body["usage"] = Usage();
  return DumpJson(body);
}

std::string OpenAiResponder::StreamError(const absl::Status& status) {
  return absl::StrCat("data: ", ToHttpError(status).body, "\n\n");
}

}  // namespace moesh
