// DeepSeek-V3.2's and DeepSeek-V4's prompt formats, which ship as Python
// encoders (encoding/encoding_dsv32.py, encoding/encoding_dsv4.py in the
// checkpoints' repositories) instead of a Jinja chat template: this renders
// what their encode_messages(messages, thinking_mode, drop_thinking=True)
// returns for the messages an OpenAI request carries, the way SGLang serves
// them (an empty system message first when the conversation opens with
// another role; the request's tools on that first system message).
//
// The shared shape: BOS; a system message's text, then (tools given)
// "\n\n## Tools ..." with the function definitions as JSON lines; a user turn
// "<｜User｜>TEXT<｜Assistant｜>" followed by "<think>" (thinking, the last user
// turn) or "</think>"; an assistant turn "[REASONING</think>]CONTENT"
// ["\n\n<｜DSML｜BLOCK>\n<｜DSML｜invoke name=\"F\">\n<｜DSML｜parameter
// name=\"K\" string=\"true|false\">V</｜DSML｜parameter>...\n</｜DSML｜invoke>
// \n</｜DSML｜BLOCK>"]"<｜end▁of▁sentence｜>", where BLOCK is "function_calls"
// (V3.2) or "tool_calls" (V4) and a string argument is written as is, any
// other value as JSON. Earlier turns' reasoning is dropped. They differ in
// tool results (V3.2: "\n\n<function_results>\n<result>R</result>...\n
// </function_results>\n\n" then "<think>"/"</think>", after the assistant's
// end of sentence; V4: a user turn "<｜User｜><tool_result>R</tool_result>..."
// merged with the user text that follows), in when the assistant token
// follows a user turn (V4: only where an assistant turn or the generation
// comes next), in the tools section's wording, and in V4 keeping every turn's
// reasoning once tools are defined. JSON is written as Python's json.dumps
// (ensure_ascii=False) writes it: ", " and ": " separators, keys in the order
// given. Stateless; thread-safe.
#ifndef MOESH_COMMON_TOKENIZER_DSML_ENCODING_H_
#define MOESH_COMMON_TOKENIZER_DSML_ENCODING_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/chat_template.h"
#include "nlohmann/json.hpp"

namespace moesh {

enum class DsmlDialect { kV32, kV4 };

// The reasoning block's markers, as DeepSeek-R1, V3.2 and V4 write them
// (the encoders here, the chat templates, the output parser).
inline constexpr absl::string_view kThinkStart = "<think>";
inline constexpr absl::string_view kThinkEnd = "</think>";

struct DsmlEncodeOptions {
  // thinking_mode "thinking" (the model reasons inside <think> first) or "chat".
  bool thinking = false;
  // The request's function definitions (OpenAI's tools[i].function), each as
  // its JSON text (PythonJsonDumps of the object as the client sent it).
  std::vector<std::string> tool_schemas;
  // V4, thinking: reasoning_effort "max" (its instruction leads the prompt).
  bool max_reasoning_effort = false;
};

// The prompt text, BOS included (tokenize it without adding special tokens),
// ending in the generation prompt when the last message is a user's or a
// tool's. INVALID_ARGUMENT, naming the message, for what the reference
// encoder refuses: an empty list, a role other than system/user/assistant/
// tool, a tool message without a preceding assistant's call for it (V3.2),
// an assistant's tool call whose arguments are not a JSON object (V3.2), an
// assistant turn after the last user turn with neither reasoning nor tool
// calls in thinking mode (V3.2).
absl::StatusOr<std::string> EncodeDsmlMessages(DsmlDialect dialect,
                                               const std::vector<ChatMessage>& messages,
                                               const DsmlEncodeOptions& options);

// The tool-call block's name: "function_calls" (V3.2) or "tool_calls" (V4).
absl::string_view DsmlBlockName(DsmlDialect dialect);

// `value` as Python's json.dumps(value, ensure_ascii=False) writes it (", "
// and ": " separators, keys in their order, invalid UTF-8 as U+FFFD).
std::string PythonJsonDumps(const nlohmann::ordered_json& value);

}  // namespace moesh

#endif  // MOESH_COMMON_TOKENIZER_DSML_ENCODING_H_
