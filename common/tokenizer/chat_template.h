// Chat messages to prompt text, as the checkpoint's chat template renders
// them (tokenizer_config.json's `chat_template`, or chat_template.jinja).
//
// A Jinja template renders through moesh's Jinja engine (jinja.h) with what
// transformers' apply_chat_template gives it: `messages` (OpenAI's message
// objects: role, content or None, tool_calls with function name and
// arguments text, tool_call_id, reasoning_content), `tools` (the request's
// tool objects, or None), `documents` (None), `add_generation_prompt`,
// `bos_token`, `eos_token`, `raise_exception` and `strftime_now`; so any
// checkpoint's template renders as transformers renders it
// (chat_template_test and jinja_test compare against jinja2's output,
// tests/golden/chat_template/ and tests/golden/jinja/). A template that
// does not parse is INVALID_ARGUMENT at load, naming the line.
//
// The family says how the model's output reads (router/chat_output.h):
// DeepSeek's V3 format (`<｜User｜>`, `<｜Assistant｜>`), R1's (the same, its
// turn opening inside `<think>`), V2's (`User: ...\n\nAssistant:`), or
// another model's (kOther: plain text, no reasoning or tool-call parsing).
// A DeepSeek family's template takes tool calls and tool results where it
// has DeepSeek's tool branches (V3's and R1's do; supports_tools(): the calls
// the output parser reads back); elsewhere a tool message or tool calls are
// INVALID_ARGUMENT, not silently dropped. Another family's template gets
// every message and decides, as with transformers.
//
// DeepSeek-V3.2 and V4 ship no Jinja template but Python encoders: a
// checkpoint of those families without a template renders through
// dsml_encoding.h (families kV32, kV4), with a thinking switch and the
// request's tool definitions (ChatRenderOptions). Immutable; thread-safe.
#ifndef MOESH_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
#define MOESH_COMMON_TOKENIZER_CHAT_TEMPLATE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moesh {

namespace jinja {
class Template;
}  // namespace jinja

// An assistant's call of a tool (OpenAI's tool_calls[i]).
struct ChatToolCall {
  std::string id;
  std::string type = "function";
  std::string name;
  std::string arguments;  // JSON text, as the client sent it
};

struct ChatMessage {
  ChatMessage() = default;
  ChatMessage(std::string role, std::string content)
      : role(std::move(role)), content(std::move(content)) {}

  std::string role;     // "system", "user", "assistant", "tool" ("developer" reads as "system")
  std::string content;  // the text parts joined
  bool content_null = false;    // content was null or absent (an assistant's tool-call turn)
  bool has_tool_calls = false;  // assistant: tool_calls given (possibly empty)
  std::vector<ChatToolCall> tool_calls;
  std::string tool_call_id;  // tool: the call it answers (V4's encoder orders results by it)
  // assistant: its reasoning (rendered by V3.2's and V4's encoders for the
  // turns after the last user message; the templates never render it).
  std::string reasoning_content;
};

// How a request asks the prompt to be rendered, beyond its messages.
struct ChatRenderOptions {
  // DeepSeek-V3.2's and V4's encoders (families kV32, kV4): thinking mode
  // (the model reasons inside <think> first).
  bool thinking = false;
  // The request's function definitions (tools[i].function), each as its JSON
  // text (see PythonJsonDumps in dsml_encoding.h): the encoders render them,
  // a Jinja template gets them as `tools` ({"type": "function", "function":
  // ...} each).
  std::vector<std::string> tool_schemas;
  bool max_reasoning_effort = false;  // V4, thinking: reasoning_effort "max"
  // A Jinja template: more variables, a JSON object's text (a request's
  // chat_template_kwargs, as apply_chat_template's keyword arguments; they
  // override bos_token and eos_token, never messages, tools, documents or
  // add_generation_prompt). "" for none.
  std::string template_kwargs;
};

class ChatTemplate {
 public:
  // kV32, kV4: no Jinja template; DeepSeek's own encoders (dsml_encoding.h).
  // kOther: a Jinja template of another model family.
  enum class Family { kV2, kV3, kR1, kV32, kV4, kOther };

  // The template of the checkpoint in `model_dir`; without one, the encoder
  // of its model family (config.json's `model_type` given as `model_type`:
  // deepseek_v32, deepseek_v4); null for a checkpoint of another family
  // without a template. INVALID_ARGUMENT for an unreadable
  // tokenizer_config.json.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Load(const std::string& model_dir,
                                                            absl::string_view model_type = "");
  // DeepSeek-V3.2's (kV32) or V4's (kV4) encoder.
  static std::unique_ptr<ChatTemplate> ForEncoder(Family family);
  // From a template's text and the tokenizer's BOS and EOS strings;
  // INVALID_ARGUMENT naming the line where the text does not parse.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromText(const std::string& text,
                                                                std::string bos_token,
                                                                std::string eos_token);

  Family family() const { return family_; }
  // Whether the template renders tool calls and tool results in a format
  // the output parser reads back (DeepSeek's).
  bool supports_tools() const { return supports_tools_; }
  // Whether it is one of DeepSeek's encoders (tool calls in DSML, a thinking
  // switch, the request's tool definitions rendered).
  bool dsml() const { return family_ == Family::kV32 || family_ == Family::kV4; }
  // The prompt text (BOS included: tokenize it without adding special
  // tokens). INVALID_ARGUMENT for an empty list, a role it cannot render, a
  // null content where the template needs text.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt) const;
  // The prompt for the assistant's next turn (add_generation_prompt), with
  // `options` (a Jinja template reads only the tool definitions).
  absl::StatusOr<std::string> RenderForGeneration(const std::vector<ChatMessage>& messages,
                                                  const ChatRenderOptions& options) const;

 private:
  ChatTemplate(Family family, std::shared_ptr<const jinja::Template> jinja, bool supports_tools,
               std::string bos, std::string eos);
  absl::StatusOr<std::string> RenderJinja(const std::vector<ChatMessage>& messages,
                                          bool add_generation_prompt,
                                          const ChatRenderOptions& options) const;
  const Family family_;
  const std::shared_ptr<const jinja::Template> jinja_;  // null for kV32, kV4
  const bool supports_tools_;
  const std::string bos_;
  const std::string eos_;
};

// DeepSeek-V3's chat template as its release ships it (tool calls and tool
// outputs included; tests/golden/chat_template/deepseek_v3.jinja holds the
// same text): what `moesh mkmodel` writes into tokenizer_config.json, so
// the tiny models chat and take tool round trips.
extern const char kDeepSeekV3ChatTemplate[];
// tokenizer_config.json for a checkpoint with the DeepSeek special tokens
// (bos, eos and, `with_chat_template`, kDeepSeekV3ChatTemplate: V3.2 and V4
// ship none, their encoders stand in).
std::string DeepSeekTokenizerConfigJson(bool with_chat_template = true);

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
