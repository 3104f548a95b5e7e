// Chat messages to prompt text, as the checkpoint's chat template renders
// them (tokenizer_config.json's `chat_template`, or chat_template.jinja).
//
// Not a Jinja engine: the renderer is built in for the DeepSeek families and
// chosen by the template's text. "v3": DeepSeek-V3's format (`<｜User｜>`,
// `<｜Assistant｜>`; system messages gathered after the BOS); "r1": the same
// with an assistant's reasoning (up to its last `</think>`) dropped from the
// history and, where the template's generation prompt says so, `<think>\n`
// after the last `<｜Assistant｜>`; "v2": DeepSeek-V2(-Lite)-Chat's
// `User: ...\n\nAssistant:`. Each renders exactly what transformers'
// apply_chat_template renders from that template (chat_template_test checks
// against jinja2's output of the shipped templates, tests/golden/
// chat_template/), quirks included.
//
// Tools: where the template has DeepSeek's tool branches (V3's and R1's do),
// an assistant's tool calls render as `<｜tool▁calls▁begin｜>` ...
// `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```
// <｜tool▁call▁end｜>` ... and tool results as `<｜tool▁outputs▁begin｜>
// <｜tool▁output▁begin｜>...<｜tool▁output▁end｜>...<｜tool▁outputs▁end｜>`,
// with the variant's details read from the template's text (which message
// counts as a tool-calling one, where `<｜tool▁calls▁end｜>` goes, the
// separator between outputs). Neither template renders the request's tool
// definitions (`tools`), so neither does this. A tool message or tool calls
// on a template without tool branches are INVALID_ARGUMENT, as is a template
// of another family.
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

// How a request asks the prompt to be rendered, beyond its messages: only
// DeepSeek-V3.2's and V4's encoders (families kV32, kV4) read these.
struct ChatRenderOptions {
  bool thinking = false;  // thinking mode: the model reasons inside <think> first
  // The request's function definitions, each as its JSON text (see
  // PythonJsonDumps in dsml_encoding.h).
  std::vector<std::string> tool_schemas;
  bool max_reasoning_effort = false;  // V4, thinking: reasoning_effort "max"
};

class ChatTemplate {
 public:
  // kV32, kV4: no Jinja template; DeepSeek's own encoders (dsml_encoding.h).
  enum class Family { kV2, kV3, kR1, kV32, kV4 };

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
  // INVALID_ARGUMENT naming what is unsupported when the text is of no
  // family above.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromText(const std::string& text,
                                                                std::string bos_token,
                                                                std::string eos_token);

  Family family() const { return family_; }
  // Whether the template renders tool calls and tool results.
  bool supports_tools() const { return tools_.supported; }
  // Whether it is one of DeepSeek's encoders (tool calls in DSML, a thinking
  // switch, the request's tool definitions rendered).
  bool dsml() const { return family_ == Family::kV32 || family_ == Family::kV4; }
  // The prompt text (BOS included: tokenize it without adding special
  // tokens). INVALID_ARGUMENT for an empty list, a role it cannot render, a
  // null content where the template needs text.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt) const;
  // The prompt for the assistant's next turn (add_generation_prompt), with
  // `options` where the family reads them (dsml()); the Jinja families ignore
  // them.
  absl::StatusOr<std::string> RenderForGeneration(const std::vector<ChatMessage>& messages,
                                                  const ChatRenderOptions& options) const;

 private:
  // The variant of the template's tool branches.
  struct ToolStyle {
    bool supported = false;       // it has DeepSeek's tool branches
    bool calls_by_key = false;    // R1: 'tool_calls' in message (V3: content is none)
    bool calls_end_once = false;  // R1: calls_end once after the calls (V3: after each later call)
    bool output_newline = false;  // V3: "\n" before a later tool output
  };
  ChatTemplate(Family family, bool think_prompt, bool last_system_wins, ToolStyle tools,
               std::string bos, std::string eos)
      : family_(family),
        think_prompt_(think_prompt),
        last_system_wins_(last_system_wins),
        tools_(tools),
        bos_(std::move(bos)),
        eos_(std::move(eos)) {}
  absl::StatusOr<std::string> RenderV3(const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt) const;
  const Family family_;
  const bool think_prompt_;      // r1: the generation prompt opens "<think>\n"
  const bool last_system_wins_;  // R1-Distill: the last system message alone
  const ToolStyle tools_;
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
