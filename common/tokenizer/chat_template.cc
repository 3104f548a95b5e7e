#include "common/tokenizer/chat_template.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_util.h"
#include "nlohmann/json.hpp"

namespace moesh {

const char kDeepSeekV3ChatTemplate[] =
    R"jinja({% if not add_generation_prompt is defined %})jinja"
    R"jinja({% set add_generation_prompt = false %}{% endif %})jinja"
    R"jinja({% set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %})jinja"
    R"jinja({%- for message in messages %}{%- if message['role'] == 'system' %})jinja"
    R"jinja({%- if ns.is_first_sp %})jinja"
    R"jinja({% set ns.system_prompt = ns.system_prompt + message['content'] %})jinja"
    R"jinja({% set ns.is_first_sp = false %}{%- else %})jinja"
    R"jinja({% set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %})jinja"
    R"jinja({%- endif %}{%- endif %}{%- endfor %})jinja"
    R"jinja({{ bos_token }}{{ ns.system_prompt }}{%- for message in messages %})jinja"
    R"jinja({%- if message['role'] == 'user' %}{%- set ns.is_tool = false -%})jinja"
    R"jinja({{'<｜User｜>' + message['content']}}{%- endif %})jinja"
    R"jinja({%- if message['role'] == 'assistant' and message['content'] is not none %})jinja"
    R"jinja({{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- endif %})jinja"
    R"jinja({%- endfor -%}{% if add_generation_prompt %}{{'<｜Assistant｜>'}}{% endif %})jinja";

std::string DeepSeekTokenizerConfigJson() {
  nlohmann::json j;
  j["bos_token"] = "<｜begin▁of▁sentence｜>";
  j["eos_token"] = "<｜end▁of▁sentence｜>";
  j["add_bos_token"] = true;
  j["add_eos_token"] = false;
  j["chat_template"] = kDeepSeekV3ChatTemplate;
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

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Load(const std::string& model_dir) {
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
  if (chat_template.empty()) return std::unique_ptr<ChatTemplate>();
  return FromText(chat_template, TokenText(config, "bos_token"), TokenText(config, "eos_token"));
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromText(const std::string& text,
                                                                     std::string bos_token,
                                                                     std::string eos_token) {
  Family family;
  if (absl::StrContains(text, "<｜User｜>") && absl::StrContains(text, "<｜Assistant｜>")) {
    family = absl::StrContains(text, "</think>") ? Family::kR1 : Family::kV3;
  } else if (absl::StrContains(text, "'User: '") && absl::StrContains(text, "'Assistant:")) {
    family = Family::kV2;
  } else {
    return absl::InvalidArgumentError(
        "the checkpoint's chat template is not one this server renders (built in: DeepSeek "
        "V2, V3 and R1 formats)");
  }
  const bool think_prompt =
      family == Family::kR1 && absl::StrContains(text, "<｜Assistant｜><think>\\n");
  return std::unique_ptr<ChatTemplate>(
      new ChatTemplate(family, think_prompt, std::move(bos_token), std::move(eos_token)));
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt) const {
  if (messages.empty()) return absl::InvalidArgumentError("messages is empty");
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat(
          "a message of role '", m.role,
          "' cannot be rendered (system, user and assistant messages are; tools are not yet)"));
    }
  }
  std::string out = bos_;
  if (family_ == Family::kV2) {
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
  std::vector<absl::string_view> system;
  for (const ChatMessage& m : messages) {
    if (m.role == "system") system.push_back(m.content);
  }
  out += absl::StrJoin(system, "\n\n");
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      absl::StrAppend(&out, "<｜User｜>", m.content);
    } else if (m.role == "assistant") {
      absl::string_view content = m.content;
      if (family_ == Family::kR1) {
        const size_t think_end = content.rfind("</think>");
        if (think_end != absl::string_view::npos) content.remove_prefix(think_end + 8);
      }
      absl::StrAppend(&out, "<｜Assistant｜>", content, "<｜end▁of▁sentence｜>");
    }
  }
  if (add_generation_prompt) {
    out += "<｜Assistant｜>";
    if (think_prompt_) out += "<think>\n";
  }
  return out;
}

}  // namespace moesh
