// libFuzzer target: a checkpoint's chat template (ChatTemplate::FromText, the
// Jinja engine). The input is the template's text; a template that parses
// renders a conversation with a system prompt, tool calls and results, and
// the request's tools, within the engine's bounds and without crashing.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::unique_ptr<moesh::ChatTemplate>> t =
      moesh::ChatTemplate::FromText(text, "<s>", "</s>");
  if (!t.ok()) return 0;
  moesh::ChatMessage call("assistant", "");
  call.content_null = true;
  call.has_tool_calls = true;
  call.tool_calls.push_back({"call_1", "function", "get_weather", "{\"city\": \"Paris\"}"});
  moesh::ChatMessage result("tool", "{\"c\": 21}");
  result.tool_call_id = "call_1";
  const std::vector<moesh::ChatMessage> chat = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "<think>x</think>Hello"},
      {"user", "Weather?"},    call,           result};
  (void)(*t)->Render(chat, /*add_generation_prompt=*/false);
  moesh::ChatRenderOptions options;
  options.tool_schemas.push_back(
      "{\"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}}");
  (void)(*t)->RenderForGeneration(chat, options);
  return 0;
}
