#include "router/openai_api.h"

#include <cmath>
#include <limits>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/serving/generation_flow.h"
#include "common/tokenizer/dsml_encoding.h"

namespace moesh {
namespace {

using Json = nlohmann::json;

constexpr char kParamPayload[] = "moesh.openai.param";
// The most stop strings and stop token ids a request may give.
constexpr size_t kMaxStops = 16;

absl::Status Invalid(absl::string_view param, absl::string_view message) {
  return InvalidParamError(param, message);
}

// Field readers: absent or null leaves the output alone; a wrong type is
// INVALID_ARGUMENT naming the field.
class Fields {
 public:
  explicit Fields(const Json& j) : j_(j) {}
  const Json* Get(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  absl::Status Bool(const char* key, bool* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return Invalid(key, absl::StrCat(key, " must be a boolean"));
    *out = v->get<bool>();
    return absl::OkStatus();
  }
  absl::Status Int(const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number_integer()) return Invalid(key, absl::StrCat(key, " must be an integer"));
    const int64_t x =
        v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX ? INT64_MAX : v->get<int64_t>();
    if (x < lo || x > hi) {
      return Invalid(key, absl::StrCat(key, " must lie in [", lo, ", ", hi, "], got ", x));
    }
    *out = x;
    return absl::OkStatus();
  }
  absl::Status Number(const char* key, double lo, double hi, std::optional<double>* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_number()) return Invalid(key, absl::StrCat(key, " must be a number"));
    const double x = v->get<double>();
    if (!(x >= lo && x <= hi)) {
      return Invalid(key, absl::StrCat(key, " must lie in [", lo, ", ", hi, "], got ", x));
    }
    *out = x;
    return absl::OkStatus();
  }

 private:
  const Json& j_;
};

// A message's content: a string, or a list of text parts joined.
absl::StatusOr<std::string> ContentText(const Json& content, size_t i) {
  const std::string param = absl::StrCat("messages[", i, "].content");
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return std::string();
  if (!content.is_array()) return Invalid(param, param + " must be a string or a list of parts");
  std::string text;
  for (const Json& part : content) {
    if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      return Invalid(param, param +
                                ": only text parts ({\"type\": \"text\", \"text\": ...}) "
                                "are supported");
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// A function's name as OpenAI allows it: [a-zA-Z0-9_-]{1,64}.
bool ValidFunctionName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  }
  return true;
}

// An assistant message's tool_calls: [{id, type: "function", function: {name,
// arguments}}].
absl::Status ParseToolCalls(const Json& calls, const std::string& param, ChatMessage* msg) {
  if (!calls.is_array()) return Invalid(param, param + " must be a list");
  msg->has_tool_calls = true;
  for (size_t k = 0; k < calls.size(); ++k) {
    const Json& c = calls[k];
    const std::string p = absl::StrCat(param, "[", k, "]");
    if (!c.is_object()) return Invalid(p, p + " must be an object");
    ChatToolCall call;
    if (c.contains("id") && c["id"].is_string()) call.id = c["id"].get<std::string>();
    if (c.contains("type") && !(c["type"].is_string() && c["type"] == "function"))
      return Invalid(p + ".type", p + ".type must be \"function\"");
    auto f = c.find("function");
    if (f == c.end() || !f->is_object())
      return Invalid(p + ".function", p + ".function must be an object");
    if (!f->contains("name") || !(*f)["name"].is_string())
      return Invalid(p + ".function.name", p + ".function.name must be a string");
    call.name = (*f)["name"].get<std::string>();
    if (!f->contains("arguments") || !(*f)["arguments"].is_string())
      return Invalid(p + ".function.arguments", p + ".function.arguments must be a string");
    call.arguments = (*f)["arguments"].get<std::string>();
    msg->tool_calls.push_back(std::move(call));
  }
  return absl::OkStatus();
}

// tools: [{type: "function", function: {name, description?, parameters?}}]
// and tool_choice: "none" | "auto" | "required" | {type: "function",
// function: {name}} naming one of them.
absl::Status ParseTools(const Json& j, OpenAiRequest* r) {
  Fields f(j);
  if (const Json* t = f.Get("tools"); t != nullptr) {
    if (!r->chat) return Invalid("tools", "tools are only for /v1/chat/completions");
    if (!t->is_array()) return Invalid("tools", "tools must be a list");
    for (size_t i = 0; i < t->size(); ++i) {
      const Json& tool = (*t)[i];
      const std::string p = absl::StrCat("tools[", i, "]");
      if (!tool.is_object()) return Invalid(p, p + " must be an object");
      if (!tool.contains("type") || tool["type"] != "function")
        return Invalid(p + ".type", p + ".type must be \"function\"");
      auto fn = tool.find("function");
      if (fn == tool.end() || !fn->is_object())
        return Invalid(p + ".function", p + ".function must be an object");
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || !ValidFunctionName(name->get<std::string>()))
        return Invalid(p + ".function.name",
                       p + ".function.name must be a string of a-z, A-Z, 0-9, _ and -, at most "
                           "64 characters");
      auto desc = fn->find("description");
      if (desc != fn->end() && !desc->is_null() && !desc->is_string())
        return Invalid(p + ".function.description", p + ".function.description must be a string");
      auto params = fn->find("parameters");
      if (params != fn->end() && !params->is_null() && !params->is_object())
        return Invalid(p + ".function.parameters",
                       p + ".function.parameters must be a JSON Schema object");
      r->tools.push_back(tool);
    }
  }
  const Json* c = f.Get("tool_choice");
  if (c == nullptr) {
    r->tool_choice = r->tools.empty() ? "none" : "auto";
    return absl::OkStatus();
  }
  if (c->is_string()) {
    const std::string choice = c->get<std::string>();
    if (choice != "none" && choice != "auto" && choice != "required")
      return Invalid("tool_choice",
                     "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": "
                     "\"function\", \"function\": {\"name\": ...}}");
    r->tool_choice = choice;
  } else if (c->is_object()) {
    if (!c->contains("type") || (*c)["type"] != "function")
      return Invalid("tool_choice.type", "tool_choice.type must be \"function\"");
    auto fn = c->find("function");
    if (fn == c->end() || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string())
      return Invalid("tool_choice.function.name", "tool_choice.function.name must be a string");
    r->tool_choice = "function";
    r->tool_choice_name = (*fn)["name"].get<std::string>();
  } else {
    return Invalid("tool_choice", "tool_choice must be a string or an object");
  }
  if (r->tool_choice != "none" && r->tools.empty()) {
    return Invalid("tool_choice", absl::StrCat("tool_choice \"", r->tool_choice, "\" needs tools"));
  }
  if (r->tool_choice == "function") {
    bool found = false;
    for (const Json& t : r->tools) found |= t["function"]["name"] == r->tool_choice_name;
    if (!found) {
      return Invalid(
          "tool_choice.function.name",
          absl::StrCat("tool_choice names '", r->tool_choice_name, "', which is not among tools"));
    }
  }
  return absl::OkStatus();
}

// The function definitions as the client wrote them (keys in its order), for
// the encoders that render them.
std::vector<std::string> ToolSchemas(absl::string_view body) {
  const nlohmann::ordered_json j =
      nlohmann::ordered_json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  std::vector<std::string> schemas;
  for (const nlohmann::ordered_json& tool : j["tools"]) {  // validated by ParseTools
    schemas.push_back(PythonJsonDumps(tool["function"]));
  }
  return schemas;
}

// chat_template_kwargs (the template's variables; {"thinking": bool} is
// SGLang's and vLLM's switch, "enable_thinking" too) and reasoning_effort.
absl::Status ParseThinking(const Json& j, OpenAiRequest* r) {
  Fields f(j);
  if (const Json* k = f.Get("chat_template_kwargs"); k != nullptr) {
    if (!k->is_object())
      return Invalid("chat_template_kwargs", "chat_template_kwargs must be an object");
    for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"}) {
      if (k->contains(reserved)) {
        return Invalid(absl::StrCat("chat_template_kwargs.", reserved),
                       absl::StrCat("chat_template_kwargs.", reserved,
                                    " is set by the request itself, not a template argument"));
      }
    }
    r->template_kwargs = k->dump();
    for (const char* key : {"thinking", "enable_thinking"}) {
      auto it = k->find(key);
      if (it == k->end() || it->is_null()) continue;
      if (!it->is_boolean()) {
        return Invalid(absl::StrCat("chat_template_kwargs.", key),
                       absl::StrCat("chat_template_kwargs.", key, " must be a boolean"));
      }
      r->thinking = it->get<bool>();
    }
  }
  if (const Json* e = f.Get("reasoning_effort"); e != nullptr) {
    if (!e->is_string()) return Invalid("reasoning_effort", "reasoning_effort must be a string");
    r->max_reasoning_effort = e->get<std::string>() == "max";
  }
  return absl::OkStatus();
}

absl::Status ParseMessages(const Json& j, OpenAiRequest* r) {
  auto it = j.find("messages");
  if (it == j.end() || it->is_null()) return Invalid("messages", "messages is required");
  if (!it->is_array()) return Invalid("messages", "messages must be a list");
  if (it->empty()) return Invalid("messages", "messages is empty");
  for (size_t i = 0; i < it->size(); ++i) {
    const Json& m = (*it)[i];
    const std::string param = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Invalid(param, param + " must be an object");
    if (!m.contains("role") || !m["role"].is_string())
      return Invalid(param + ".role", param + ".role must be a string");
    ChatMessage msg;
    msg.role = m["role"].get<std::string>();
    if (msg.role == "developer") msg.role = "system";
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      RETURN_IF_ERROR(ParseToolCalls(m["tool_calls"], param + ".tool_calls", &msg));
    }
    if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) {
      msg.tool_call_id = m["tool_call_id"].get<std::string>();
    }
    if (m.contains("reasoning_content") && !m["reasoning_content"].is_null()) {
      if (!m["reasoning_content"].is_string())
        return Invalid(param + ".reasoning_content", param + ".reasoning_content must be a string");
      msg.reasoning_content = m["reasoning_content"].get<std::string>();
    }
    const Json content = m.contains("content") ? m["content"] : Json();
    msg.content_null = content.is_null();
    absl::StatusOr<std::string> text = ContentText(content, i);
    if (!text.ok()) return text.status();
    msg.content = std::move(*text);
    r->messages.push_back(std::move(msg));
  }
  return absl::OkStatus();
}

absl::Status ParsePrompt(const Json& j, OpenAiRequest* r) {
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null()) return Invalid("prompt", "prompt is required");
  Json p = *it;
  if (p.is_array() && p.size() == 1 && (p[0].is_string() || p[0].is_array())) {
    p = Json(p[0]);  // a batch of one
  }
  if (p.is_string()) {
    r->generate.set_text(p.get<std::string>());
    return absl::OkStatus();
  }
  if (p.is_array()) {
    v1::TokenIds* ids = r->generate.mutable_token_ids();
    for (const Json& t : p) {
      if (!t.is_number_integer()) {
        return Invalid("prompt",
                       t.is_string() || t.is_array()
                           ? "a list of several prompts is not supported: send one per request"
                           : "prompt must be a string, a list of token ids, or a list of one");
      }
      const int64_t id = t.get<int64_t>();
      if (id < 0 || id > std::numeric_limits<int32_t>::max())
        return Invalid("prompt", absl::StrCat("prompt token id ", id, " is out of range"));
      ids->add_ids(static_cast<int32_t>(id));
    }
    return absl::OkStatus();
  }
  return Invalid("prompt", "prompt must be a string or a list of token ids");
}

absl::Status ParseStop(const Json& j, OpenAiRequest* r) {
  auto it = j.find("stop");
  v1::StopConditions* stop = r->generate.mutable_stop();
  if (it != j.end() && !it->is_null()) {
    std::vector<Json> items =
        it->is_array() ? std::vector<Json>(it->begin(), it->end()) : std::vector<Json>{*it};
    if (items.size() > kMaxStops)
      return Invalid("stop", absl::StrCat("at most ", kMaxStops, " stop strings"));
    for (const Json& s : items) {
      if (!s.is_string()) return Invalid("stop", "stop must be a string or a list of strings");
      if (s.get<std::string>().empty()) return Invalid("stop", "a stop string is empty");
      stop->add_stop_strings(s.get<std::string>());
    }
  }
  it = j.find("stop_token_ids");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() > kMaxStops)
      return Invalid("stop_token_ids", "stop_token_ids must be a list of at most 16 ids");
    for (const Json& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() > std::numeric_limits<int32_t>::max())
        return Invalid("stop_token_ids", "stop_token_ids must hold token ids");
      stop->add_stop_token_ids(static_cast<int32_t>(t.get<int64_t>()));
    }
  }
  bool ignore_eos = false;
  RETURN_IF_ERROR(Fields(j).Bool("ignore_eos", &ignore_eos));
  stop->set_ignore_eos(ignore_eos);
  return absl::OkStatus();
}

// Fields OpenAI defines that this server cannot honour: refused, not ignored.
absl::Status RefuseUnsupported(const Json& j, bool chat) {
  Fields f(j);
  if (!chat) {
    std::optional<int64_t> best_of;
    RETURN_IF_ERROR(f.Int("best_of", 1, 128, &best_of));
    if (best_of.has_value() && *best_of != 1)
      return Invalid("best_of", "best_of > 1 is not supported");
    if (const Json* s = f.Get("suffix"); s != nullptr && !(s->is_string() && s->empty()))
      return Invalid("suffix", "suffix is not supported");
  }
  if (const Json* b = f.Get("logit_bias"); b != nullptr && !(b->is_object() && b->empty()))
    return Invalid("logit_bias", "logit_bias is not supported");
  if (const Json* rf = f.Get("response_format"); rf != nullptr) {
    if (!rf->is_object() || rf->value("type", "") != "text")
      return Invalid("response_format", "only response_format {\"type\": \"text\"} is supported");
  }
  return absl::OkStatus();
}

absl::Status ParseSampling(const Json& j, OpenAiRequest* r) {
  Fields f(j);
  v1::SamplingParams* s = r->generate.mutable_sampling();
  std::optional<double> x;
  RETURN_IF_ERROR(f.Number("temperature", 0, 2, &x));
  if (x) s->set_temperature(static_cast<float>(*x));
  x.reset();
  RETURN_IF_ERROR(f.Number("top_p", 0, 1, &x));
  if (x) {
    if (*x <= 0) return Invalid("top_p", "top_p must be > 0");
    s->set_top_p(static_cast<float>(*x));
  }
  x.reset();
  RETURN_IF_ERROR(f.Number("min_p", 0, 1, &x));
  if (x) s->set_min_p(static_cast<float>(*x));
  x.reset();
  RETURN_IF_ERROR(f.Number("presence_penalty", -2, 2, &x));
  if (x) s->set_presence_penalty(static_cast<float>(*x));
  x.reset();
  RETURN_IF_ERROR(f.Number("frequency_penalty", -2, 2, &x));
  if (x) s->set_frequency_penalty(static_cast<float>(*x));
  x.reset();
  RETURN_IF_ERROR(f.Number("repetition_penalty", 0, 100, &x));
  if (x) {
    if (*x <= 0) return Invalid("repetition_penalty", "repetition_penalty must be > 0");
    s->set_repetition_penalty(static_cast<float>(*x));
  }
  std::optional<int64_t> i;
  RETURN_IF_ERROR(f.Int("top_k", -1, std::numeric_limits<int32_t>::max(), &i));
  if (i) s->set_top_k(*i < 0 ? 0 : static_cast<int32_t>(*i));  // -1: all, as vLLM
  i.reset();
  RETURN_IF_ERROR(
      f.Int("seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &i));
  if (i) s->set_seed(static_cast<uint64_t>(*i));
  // max_completion_tokens is chat's newer name; either sets the limit.
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    i.reset();
    RETURN_IF_ERROR(f.Int(key, 1, std::numeric_limits<int32_t>::max(), &i));
    if (i) {
      r->generate.mutable_stop()->set_max_new_tokens(static_cast<int32_t>(*i));
      r->max_tokens_field = key;
    }
  }
  // Log-probabilities: completions' `logprobs` is the number of alternatives
  // (0: the sampled token's only); chat's is a bool, with `top_logprobs`.
  i.reset();
  if (r->chat) {
    RETURN_IF_ERROR(f.Bool("logprobs", &r->logprobs));
    RETURN_IF_ERROR(f.Int("top_logprobs", 0, 20, &i));
    if (i && !r->logprobs) return Invalid("top_logprobs", "top_logprobs needs logprobs: true");
  } else {
    RETURN_IF_ERROR(f.Int("logprobs", 0, 20, &i));
    r->logprobs = i.has_value();
  }
  r->top_logprobs = i ? static_cast<int>(*i) : 0;
  RETURN_IF_ERROR(f.Bool("return_tokens_as_token_ids", &r->tokens_as_ids));
  if (r->logprobs) {
    s->set_logprobs(true);  // each token's own
    s->set_top_logprobs(r->top_logprobs);
  }
  if (!r->chat) {
    RETURN_IF_ERROR(f.Bool("echo", &r->echo));
    // echo with logprobs: the prompt's tokens' too, from the prefill pass.
    if (r->echo && r->logprobs) s->set_prompt_logprobs(r->top_logprobs);
  }
  // n: sibling choices, within GenerateRequest.n's limit.
  i.reset();
  RETURN_IF_ERROR(f.Int("n", 1, kMaxChoices, &i));
  r->n = i ? static_cast<int>(*i) : 1;
  r->generate.set_n(r->n);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(absl::string_view body, bool chat) {
  Json j = Json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Invalid("", "the request body is not valid JSON");
  if (!j.is_object()) return Invalid("", "the request body must be a JSON object");
  OpenAiRequest r;
  r.chat = chat;
  Fields f(j);
  if (const Json* m = f.Get("model"); m != nullptr) {
    if (!m->is_string()) return Invalid("model", "model must be a string");
    r.model = m->get<std::string>();
  }
  RETURN_IF_ERROR(f.Bool("stream", &r.stream));
  if (const Json* so = f.Get("stream_options"); so != nullptr) {
    if (!so->is_object()) return Invalid("stream_options", "stream_options must be an object");
    RETURN_IF_ERROR(Fields(*so).Bool("include_usage", &r.include_usage));
  }
  RETURN_IF_ERROR(RefuseUnsupported(j, chat));
  RETURN_IF_ERROR(chat ? ParseMessages(j, &r) : ParsePrompt(j, &r));
  if (chat) {
    RETURN_IF_ERROR(ParseTools(j, &r));
    if (!r.tools.empty()) r.tool_schemas = ToolSchemas(body);
    RETURN_IF_ERROR(f.Bool("separate_reasoning", &r.separate_reasoning));
    RETURN_IF_ERROR(ParseThinking(j, &r));
  } else if (f.Get("tools") != nullptr || f.Get("tool_choice") != nullptr) {
    return Invalid(f.Get("tools") != nullptr ? "tools" : "tool_choice",
                   "tools are only for /v1/chat/completions");
  }
  RETURN_IF_ERROR(ParseSampling(j, &r));
  RETURN_IF_ERROR(ParseStop(j, &r));
  r.generate.set_detokenize(true);
  return r;
}

absl::StatusOr<std::string> RenderChatPrompt(const ChatTemplate& chat_template, OpenAiRequest* r) {
  const bool calls = r->tool_choice != "none" && !r->tools.empty();
  if (calls && !chat_template.supports_tools()) {
    return Invalid("tools",
                   "this model's chat template has no tool-call format (use tool_choice \"none\")");
  }
  const bool dsml = chat_template.dsml();
  ChatRenderOptions render;
  render.thinking = r->thinking;
  render.template_kwargs = r->template_kwargs;
  if (calls) render.tool_schemas = r->tool_schemas;
  render.max_reasoning_effort = r->max_reasoning_effort;
  absl::StatusOr<std::string> prompt = chat_template.RenderForGeneration(r->messages, render);
  if (!prompt.ok()) return Invalid("messages", prompt.status().message());
  ChatOutputParser::Options& o = r->output;
  o.reasoning = r->separate_reasoning &&
                (dsml ? r->thinking : chat_template.family() == ChatTemplate::Family::kR1);
  o.in_reasoning =
      absl::EndsWith(*prompt, dsml ? std::string(kThinkStart) : absl::StrCat(kThinkStart, "\n"));
  o.tools = calls;
  if (dsml) {
    o.tool_format = ChatOutputParser::ToolFormat::kDsml;
    o.dsml_block = std::string(DsmlBlockName(chat_template.family() == ChatTemplate::Family::kV32
                                                 ? DsmlDialect::kV32
                                                 : DsmlDialect::kV4));
  }
  r->forced_output.clear();
  if (calls && (r->tool_choice == "required" || r->tool_choice == "function")) {
    // The model must call: its turn opens with the call's opening (after an
    // empty reasoning block where the prompt opened one).
    if (dsml) {
      if (o.in_reasoning) r->forced_output = std::string(kThinkEnd);
      absl::StrAppend(&r->forced_output, "\n\n<｜DSML｜", o.dsml_block,
                      ">\n<｜DSML｜invoke name=\"");
      if (r->tool_choice == "function") {
        absl::StrAppend(&r->forced_output, r->tool_choice_name, "\">\n");
      }
    } else {
      if (o.in_reasoning) r->forced_output = absl::StrCat(kThinkEnd, "\n\n");
      absl::StrAppend(&r->forced_output, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function",
                      "<｜tool▁sep｜>");
      if (r->tool_choice == "function") {
        absl::StrAppend(&r->forced_output, r->tool_choice_name, "\n```json\n");
      }
    }
    *prompt += r->forced_output;
  }
  return prompt;
}

absl::Status InvalidParamError(absl::string_view param, absl::string_view message) {
  absl::Status s = absl::InvalidArgumentError(message);
  s.SetPayload(kParamPayload, absl::Cord(param));
  return s;
}

std::string ErrorParam(const absl::Status& status) {
  const auto p = status.GetPayload(kParamPayload);
  return p.has_value() ? std::string(*p) : std::string();
}

absl::Status BodyTooLargeError(int64_t limit_bytes) {
  return absl::OutOfRangeError(
      absl::StrCat("the request body is over the limit of ", limit_bytes, " bytes"));
}

absl::Status ModelNotFoundError(absl::string_view model) {
  return absl::NotFoundError(
      absl::StrCat("The model '", model, "' does not exist (GET /v1/models lists it)"));
}

HttpError ToHttpError(const absl::Status& status) {
  int http = 500;
  std::string type = "server_error", code;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
      http = 400, type = "invalid_request_error";
      break;
    case absl::StatusCode::kOutOfRange:
      http = 413, type = "invalid_request_error", code = "request_too_large";
      break;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      http = 401, type = "invalid_request_error", code = "invalid_api_key";
      break;
    case absl::StatusCode::kNotFound:
      http = 404, type = "invalid_request_error", code = "model_not_found";
      break;
    case absl::StatusCode::kAlreadyExists:
      http = 409, type = "invalid_request_error";
      break;
    case absl::StatusCode::kResourceExhausted:
      http = 429, type = "rate_limit_error", code = "rate_limit_exceeded";
      break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
      http = 503, type = "service_unavailable";
      break;
    case absl::StatusCode::kDeadlineExceeded:
      http = 504, type = "timeout";
      break;
    default:
      break;
  }
  const std::string param = ErrorParam(status);
  Json e = {{"message", std::string(status.message())},
            {"type", type},
            {"param", param.empty() ? Json() : Json(param)},
            {"code", code.empty() ? Json() : Json(code)}};
  return {http, DumpJson(Json({{"error", e}}))};
}

}  // namespace moesh
