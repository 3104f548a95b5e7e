#include "common/tokenizer/chat_template.h"

#include <ctime>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "common/tokenizer/dsml_encoding.h"
#include "common/tokenizer/jinja.h"
#include "nlohmann/json.hpp"

namespace moesh {

const char kDeepSeekV3ChatTemplate[] =
    R"jinja({% if not add_generation_prompt is defined %}{% set add_generation_prompt = fals)jinja"
    R"jinja(e %}{% endif %}{% set ns = namespace(is_first=false, is_tool=false, is_output_fi)jinja"
    R"jinja(rst=true, system_prompt='', is_first_sp=true) %}{%- for message in messages %}{%)jinja"
    R"jinja(- if message['role'] == 'system' %}{%- if ns.is_first_sp %}{% set ns.system_prom)jinja"
    R"jinja(pt = ns.system_prompt + message['content'] %}{% set ns.is_first_sp = false %}{%-)jinja"
    R"jinja( else %}{% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'])jinja"
    R"jinja( %}{%- endif %}{%- endif %}{%- endfor %}{{bos_token}}{{ns.system_prompt}}{%- for)jinja"
    R"jinja( message in messages %}{%- if message['role'] == 'user' %}{%- set ns.is_tool = f)jinja"
    R"jinja(alse -%}{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role')jinja"
    R"jinja(] == 'assistant' and message['content'] is none %}{%- set ns.is_tool = false -%})jinja"
    R"jinja({%- for tool in message['tool_calls']%}{%- if not ns.is_first %}{{'<｜Assistant)jinja"
    R"jinja(｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<)jinja"
    R"jinja(｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool[')jinja"
    R"jinja(function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{%- set ns)jinja"
    R"jinja(.is_first = true -%}{%- else %}{{'\n' + '<｜tool▁call▁begin｜>' + tool['ty)jinja"
    R"jinja(pe'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n')jinja"
    R"jinja( + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{)jinja"
    R"jinja({'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}{%- endif %}{%- endfor)jinja"
    R"jinja( %}{%- endif %}{%- if message['role'] == 'assistant' and message['content'] is n)jinja"
    R"jinja(ot none %}{%- if ns.is_tool %}{{'<｜tool▁outputs▁end｜>' + message['conten)jinja"
    R"jinja(t'] + '<｜end▁of▁sentence｜>'}}{%- set ns.is_tool = false -%}{%- else %}{{)jinja"
    R"jinja('<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- en)jinja"
    R"jinja(dif %}{%- endif %}{%- if message['role'] == 'tool' %}{%- set ns.is_tool = true -)jinja"
    R"jinja(%}{%- if ns.is_output_first %}{{'<｜tool▁outputs▁begin｜><｜tool▁output)jinja"
    R"jinja(▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}{%- set ns.i)jinja"
    R"jinja(s_output_first = false %}{%- else %}{{'\n<｜tool▁output▁begin｜>' + messag)jinja"
    R"jinja(e['content'] + '<｜tool▁output▁end｜>'}}{%- endif %}{%- endif %}{%- endfor)jinja"
    R"jinja( -%}{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}{% if add_ge)jinja"
    R"jinja(neration_prompt and not ns.is_tool %}{{'<｜Assistant｜>'}}{% endif %})jinja";

std::string DeepSeekTokenizerConfigJson(bool with_chat_template) {
  nlohmann::json j;
  j["bos_token"] = "<｜begin▁of▁sentence｜>";
  j["eos_token"] = "<｜end▁of▁sentence｜>";
  j["add_bos_token"] = true;
  j["add_eos_token"] = false;
  if (with_chat_template) j["chat_template"] = kDeepSeekV3ChatTemplate;
  return j.dump(2) + "\n";
}

namespace {

// A special token's text: tokenizer_config.json has it as a string or as an
// AddedToken object {"content": ...}.
std::string TokenText(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Load(const std::string& model_dir,
                                                                 absl::string_view model_type) {
  const std::string config_path = JoinPath(model_dir, "tokenizer_config.json");
  nlohmann::json config = nlohmann::json::object();
  if (FileExists(config_path)) {
    absl::StatusOr<std::string> text = ReadFileToString(config_path);
    if (!text.ok()) return text.status();
    config = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object())
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
  }
  std::string chat_template;
  auto it = config.find("chat_template");
  if (it != config.end() && it->is_string()) {
    chat_template = it->get<std::string>();
  } else if (it != config.end() && it->is_array()) {  // named templates: take "default"
    for (const nlohmann::json& t : *it) {
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") &&
          t["template"].is_string()) {
        chat_template = t["template"].get<std::string>();
      }
    }
  }
  const std::string jinja_path = JoinPath(model_dir, "chat_template.jinja");
  if (chat_template.empty() && FileExists(jinja_path)) {
    absl::StatusOr<std::string> text = ReadFileToString(jinja_path);
    if (!text.ok()) return text.status();
    chat_template = *text;
  }
  if (chat_template.empty()) {
    if (model_type == "deepseek_v32") return ForEncoder(Family::kV32);
    if (model_type == "deepseek_v4") return ForEncoder(Family::kV4);
    return std::unique_ptr<ChatTemplate>();
  }
  return FromText(chat_template, TokenText(config, "bos_token"), TokenText(config, "eos_token"));
}

ChatTemplate::ChatTemplate(Family family, std::shared_ptr<const jinja::Template> jinja,
                           bool supports_tools, std::string bos, std::string eos)
    : family_(family),
      jinja_(std::move(jinja)),
      supports_tools_(supports_tools),
      bos_(std::move(bos)),
      eos_(std::move(eos)) {}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromText(const std::string& text,
                                                                     std::string bos_token,
                                                                     std::string eos_token) {
  absl::StatusOr<std::unique_ptr<jinja::Template>> jinja = jinja::Template::Parse(text);
  if (!jinja.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint's chat template does not parse: ", jinja.status().message()));
  }
  // How the model's output reads, from the template's format.
  Family family = Family::kOther;
  if (absl::StrContains(text, "<｜User｜>") && absl::StrContains(text, "<｜Assistant｜>")) {
    family = absl::StrContains(text, kThinkEnd) ? Family::kR1 : Family::kV3;
  } else if (absl::StrContains(text, "'User: '") && absl::StrContains(text, "'Assistant:")) {
    family = Family::kV2;
  }
  const bool tools = (family == Family::kV3 || family == Family::kR1) &&
                     absl::StrContains(text, "<｜tool▁calls▁begin｜>") &&
                     absl::StrContains(text, "<｜tool▁outputs▁begin｜>");
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(
      family, std::move(*jinja), tools, std::move(bos_token), std::move(eos_token)));
}

std::unique_ptr<ChatTemplate> ChatTemplate::ForEncoder(Family family) {
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(family, nullptr, /*supports_tools=*/true,
                                                        "<｜begin▁of▁sentence｜>",
                                                        "<｜end▁of▁sentence｜>"));
}

absl::StatusOr<std::string> ChatTemplate::RenderForGeneration(
    const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) const {
  if (!dsml()) return RenderJinja(messages, /*add_generation_prompt=*/true, options);
  DsmlEncodeOptions o;
  o.thinking = options.thinking;
  o.tool_schemas = options.tool_schemas;
  o.max_reasoning_effort = options.max_reasoning_effort;
  return EncodeDsmlMessages(family_ == Family::kV32 ? DsmlDialect::kV32 : DsmlDialect::kV4,
                            messages, o);
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt) const {
  if (dsml()) {
    // The encoders always end in the generation prompt after a user turn.
    if (!add_generation_prompt) {
      return absl::InvalidArgumentError(
          "DeepSeek-V3.2's and V4's encoders render prompts for generation only");
    }
    return RenderForGeneration(messages, ChatRenderOptions());
  }
  return RenderJinja(messages, add_generation_prompt, ChatRenderOptions());
}

namespace {

// transformers' raise_exception: the template's own message as the error.
jinja::Value RaiseException() {
  return jinja::Value::Callable(
      "raise_exception", [](jinja::CallArgs& a) -> absl::StatusOr<jinja::Value> {
        return absl::InvalidArgumentError(a.positional.empty() ? "" : a.positional[0].Str());
      });
}

// transformers' strftime_now: the local time in the given format.
jinja::Value StrftimeNow() {
  return jinja::Value::Callable(
      "strftime_now", [](jinja::CallArgs& a) -> absl::StatusOr<jinja::Value> {
        if (a.positional.empty() || !a.positional[0].is_string()) {
          return absl::InvalidArgumentError("strftime_now takes a format string");
        }
        const std::time_t now = std::time(nullptr);
        std::tm local;
        localtime_r(&now, &local);
        char buf[256];
        const size_t n = std::strftime(buf, sizeof(buf), a.positional[0].str().c_str(), &local);
        return jinja::Value::String(std::string(buf, n));
      });
}

jinja::Value MessageValue(const ChatMessage& m) {
  using jinja::Value;
  jinja::ValueDict d = {{"role", Value::String(m.role)},
                        {"content", m.content_null ? Value::None() : Value::String(m.content)}};
  if (m.has_tool_calls) {
    jinja::ValueList calls;
    for (const ChatToolCall& c : m.tool_calls) {
      calls.push_back(
          Value::Dict({{"id", Value::String(c.id)},
                       {"type", Value::String(c.type)},
                       {"function", Value::Dict({{"name", Value::String(c.name)},
                                                 {"arguments", Value::String(c.arguments)}})}}));
    }
    d.emplace_back("tool_calls", Value::List(std::move(calls)));
  }
  if (!m.tool_call_id.empty()) d.emplace_back("tool_call_id", Value::String(m.tool_call_id));
  if (!m.reasoning_content.empty()) {
    d.emplace_back("reasoning_content", Value::String(m.reasoning_content));
  }
  return Value::Dict(std::move(d));
}

}  // namespace

absl::StatusOr<std::string> ChatTemplate::RenderJinja(const std::vector<ChatMessage>& messages,
                                                      bool add_generation_prompt,
                                                      const ChatRenderOptions& options) const {
  using jinja::Value;
  if (messages.empty()) return absl::InvalidArgumentError("messages is empty");
  // DeepSeek's formats: what their templates would drop or fail on is
  // refused by name. Another family's template decides for itself, as
  // transformers lets it.
  for (const ChatMessage& m : messages) {
    if (family_ == Family::kOther) break;
    const bool tool_role = m.role == "tool" && supports_tools_;
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && !tool_role) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a message of role '", m.role, "' cannot be rendered by this model's chat template (",
          supports_tools_ ? "system, user, assistant and tool" : "system, user and assistant",
          " messages are)"));
    }
    if (m.has_tool_calls && !supports_tools_) {
      return absl::InvalidArgumentError(
          "this model's chat template does not render an assistant's tool_calls");
    }
    if (m.content_null && !(m.role == "assistant" && m.has_tool_calls)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a message of role '", m.role, "' needs a content"));
    }
  }
  jinja::ValueList message_values;
  for (const ChatMessage& m : messages) message_values.push_back(MessageValue(m));
  Value tools = Value::None();
  if (!options.tool_schemas.empty()) {
    jinja::ValueList list;
    for (const std::string& schema : options.tool_schemas) {
      const nlohmann::ordered_json j =
          nlohmann::ordered_json::parse(schema, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) return absl::InvalidArgumentError("a tool definition is not JSON");
      list.push_back(
          Value::Dict({{"type", Value::String("function")}, {"function", Value::FromJson(j)}}));
    }
    tools = Value::List(std::move(list));
  }
  // The first of a name wins: the request's own variables, then its
  // template arguments, then the tokenizer's tokens and the functions.
  jinja::ValueDict context = {
      {"messages", Value::List(std::move(message_values))},
      {"tools", tools},
      {"documents", Value::None()},
      {"add_generation_prompt", Value::Bool(add_generation_prompt)},
  };
  if (!options.template_kwargs.empty()) {
    const nlohmann::ordered_json kwargs =
        nlohmann::ordered_json::parse(options.template_kwargs, nullptr, false);
    if (!kwargs.is_object()) {
      return absl::InvalidArgumentError("chat_template_kwargs must be a JSON object");
    }
    for (const auto& [name, value] : kwargs.items()) {
      context.emplace_back(name, Value::FromJson(value));
    }
  }
  context.emplace_back("bos_token", Value::String(bos_));
  context.emplace_back("eos_token", Value::String(eos_));
  context.emplace_back("raise_exception", RaiseException());
  context.emplace_back("strftime_now", StrftimeNow());
  return jinja_->Render(context);
}

}  // namespace moesh
