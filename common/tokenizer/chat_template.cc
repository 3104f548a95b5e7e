#include "common/tokenizer/chat_template.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "common/tokenizer/dsml_encoding.h"
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

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromText(const std::string& text,
                                                                     std::string bos_token,
                                                                     std::string eos_token) {
  Family family;
  if (absl::StrContains(text, "<｜User｜>") && absl::StrContains(text, "<｜Assistant｜>")) {
    family = absl::StrContains(text, kThinkEnd) ? Family::kR1 : Family::kV3;
  } else if (absl::StrContains(text, "'User: '") && absl::StrContains(text, "'Assistant:")) {
    family = Family::kV2;
  } else {
    return absl::InvalidArgumentError(
        "the checkpoint's chat template is not one this server renders (built in: DeepSeek "
        "V2, V3 and R1 formats)");
  }
  const bool think_prompt =
      family == Family::kR1 && absl::StrContains(text, "<｜Assistant｜><think>\\n");
  // R1-Distill's templates keep the last system message only.
  const bool last_system_wins = family != Family::kV2 && !absl::StrContains(text, "is_first_sp");
  ToolStyle tools;
  tools.supported = family != Family::kV2 && absl::StrContains(text, "<｜tool▁calls▁begin｜>") &&
                    absl::StrContains(text, "<｜tool▁outputs▁begin｜>");
  tools.calls_by_key = absl::StrContains(text, "'tool_calls' in message");
  tools.calls_end_once = absl::StrContains(text, "endfor %}{{'<｜tool▁calls▁end｜>");
  tools.output_newline = absl::StrContains(text, "'\\n<｜tool▁output▁begin｜>'");
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(
      family, think_prompt, last_system_wins, tools, std::move(bos_token), std::move(eos_token)));
}

std::unique_ptr<ChatTemplate> ChatTemplate::ForEncoder(Family family) {
  ToolStyle tools;
  tools.supported = true;
  return std::unique_ptr<ChatTemplate>(new ChatTemplate(
      family, /*think_prompt=*/false,
      /*last_system_wins=*/false, tools, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"));
}

absl::StatusOr<std::string> ChatTemplate::RenderForGeneration(
    const std::vector<ChatMessage>& messages, const ChatRenderOptions& options) const {
  if (!dsml()) return Render(messages, /*add_generation_prompt=*/true);
  DsmlEncodeOptions o;
  o.thinking = options.thinking;
  o.tool_schemas = options.tool_schemas;
  o.max_reasoning_effort = options.max_reasoning_effort;
  return EncodeDsmlMessages(family_ == Family::kV32 ? DsmlDialect::kV32 : DsmlDialect::kV4,
                            messages, o);
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt) const {
  if (messages.empty()) return absl::InvalidArgumentError("messages is empty");
  if (dsml()) {
    // The encoders always end in the generation prompt after a user turn.
    if (!add_generation_prompt) {
      return absl::InvalidArgumentError(
          "DeepSeek-V3.2's and V4's encoders render prompts for generation only");
    }
    return RenderForGeneration(messages, ChatRenderOptions());
  }
  for (const ChatMessage& m : messages) {
    const bool tool_role = m.role == "tool" && tools_.supported;
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && !tool_role) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a message of role '", m.role, "' cannot be rendered by this model's chat template (",
          tools_.supported ? "system, user, assistant and tool" : "system, user and assistant",
          " messages are)"));
    }
    if (m.has_tool_calls && !tools_.supported) {
      return absl::InvalidArgumentError(
          "this model's chat template does not render an assistant's tool_calls");
    }
    if (m.content_null && !(m.role == "assistant" && m.has_tool_calls)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a message of role '", m.role, "' needs a content"));
    }
  }
  if (family_ != Family::kV2) return RenderV3(messages, add_generation_prompt);
  std::string out = bos_;
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      absl::StrAppend(&out, "User: ", m.content, "\n\n");
    } else if (m.role == "assistant") {
      absl::StrAppend(&out, "Assistant: ", m.content, eos_);
    } else {
      absl::StrAppend(&out, m.content, "\n\n");
    }
  }
  if (add_generation_prompt) out += "Assistant:";
  return out;
}

namespace {

// One call as the templates write it, after its opening token.
std::string ToolCallText(const ChatToolCall& call) {
  return absl::StrCat("<｜tool▁call▁begin｜>", call.type, "<｜tool▁sep｜>", call.name,
                      "\n```json\n", call.arguments, "\n```<｜tool▁call▁end｜>");
}

}  // namespace

// The V3/R1 templates' state machine: `is_first` (a tool call was written,
// never reset), `is_tool` (inside tool outputs), `is_output_first` (no tool
// output written yet, never reset), as jinja2 runs them.
absl::StatusOr<std::string> ChatTemplate::RenderV3(const std::vector<ChatMessage>& messages,
                                                   bool add_generation_prompt) const {
  std::string out = bos_;
  std::vector<absl::string_view> system;
  for (const ChatMessage& m : messages) {
    if (m.role != "system") continue;
    if (last_system_wins_) system.clear();
    system.push_back(m.content);
  }
  out += absl::StrJoin(system, "\n\n");
  bool is_first = false, is_tool = false, is_output_first = true;
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      is_tool = false;
      absl::StrAppend(&out, "<｜User｜>", m.content);
      continue;
    }
    if (m.role == "tool") {
      is_tool = true;
      if (is_output_first) {
        out += "<｜tool▁outputs▁begin｜>";
        is_output_first = false;
      } else if (tools_.output_newline) {
        out += "\n";
      }
      absl::StrAppend(&out, "<｜tool▁output▁begin｜>", m.content, "<｜tool▁output▁end｜>");
      continue;
    }
    if (m.role != "assistant") continue;
    // Which assistant messages take the tool-call branch.
    const bool calls_branch =
        tools_.supported && (tools_.calls_by_key ? m.has_tool_calls : m.content_null);
    if (calls_branch) {
      is_tool = false;
      for (const ChatToolCall& call : m.tool_calls) {
        if (!is_first) {
          out += "<｜Assistant｜>";
          if (!m.content_null) out += m.content;
          absl::StrAppend(&out, "<｜tool▁calls▁begin｜>", ToolCallText(call));
          is_first = true;
        } else {
          absl::StrAppend(&out, "\n", ToolCallText(call));
          if (!tools_.calls_end_once) out += "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>";
        }
      }
      if (tools_.calls_end_once) out += "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>";
      continue;
    }
    if (m.content_null) {
      return absl::InvalidArgumentError("an assistant message without tool_calls needs a content");
    }
    if (is_tool) {
      absl::StrAppend(&out, "<｜tool▁outputs▁end｜>", m.content, "<｜end▁of▁sentence｜>");
      is_tool = false;
      continue;
    }
    absl::string_view content = m.content;
    if (family_ == Family::kR1) {
      const size_t think_end = content.rfind(kThinkEnd);
      if (think_end != absl::string_view::npos) content.remove_prefix(think_end + kThinkEnd.size());
    }
    absl::StrAppend(&out, "<｜Assistant｜>", content, "<｜end▁of▁sentence｜>");
  }
  if (is_tool) out += "<｜tool▁outputs▁end｜>";
  if (add_generation_prompt && !is_tool) {
    out += "<｜Assistant｜>";
    if (think_prompt_) absl::StrAppend(&out, kThinkStart, "\n");
  }
  return out;
}

}  // namespace moesh
