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
// apply_chat_template renders from that template for system, user and
// assistant messages (chat_template_test checks against jinja2's output).
// Tool definitions, tool calls and tool results are not rendered yet
// (INVALID_ARGUMENT); a template of another family is refused the same way.
// Immutable; thread-safe.
#ifndef MOESH_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
#define MOESH_COMMON_TOKENIZER_CHAT_TEMPLATE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace moesh {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" ("developer" reads as "system")
  std::string content;  // the text parts joined
};

class ChatTemplate {
 public:
  enum class Family { kV2, kV3, kR1 };

  // The template of the checkpoint in `model_dir`: null when it has none;
  // INVALID_ARGUMENT for an unreadable tokenizer_config.json.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Load(const std::string& model_dir);
  // From a template's text and the tokenizer's BOS and EOS strings;
  // INVALID_ARGUMENT naming what is unsupported when the text is of no
  // family above.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromText(const std::string& text,
                                                                std::string bos_token,
                                                                std::string eos_token);

  Family family() const { return family_; }
  // The prompt text (BOS included: tokenize it without adding special
  // tokens). INVALID_ARGUMENT for an empty list or a role it cannot render.
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt) const;

 private:
  ChatTemplate(Family family, bool think_prompt, std::string bos, std::string eos)
      : family_(family), think_prompt_(think_prompt), bos_(std::move(bos)), eos_(std::move(eos)) {}
  const Family family_;
  const bool think_prompt_;  // r1: the generation prompt opens "<think>\n"
  const std::string bos_;
  const std::string eos_;
};

// DeepSeek-V3's chat template without its tool branches: what `moesh
// mkmodel` writes into tokenizer_config.json, so the tiny models chat.
extern const char kDeepSeekV3ChatTemplate[];
// tokenizer_config.json for a checkpoint with the DeepSeek special tokens
// (bos, eos and kDeepSeekV3ChatTemplate).
std::string DeepSeekTokenizerConfigJson();

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_CHAT_TEMPLATE_H_
