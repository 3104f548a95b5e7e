#include "common/tokenizer/dsml_encoding.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace moesh {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr absl::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr absl::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr absl::string_view kUser = "<｜User｜>";
constexpr absl::string_view kAssistant = "<｜Assistant｜>";

// The tools sections, as the reference encoders' templates write them with
// DSML's token and the thinking tokens filled in; %SCHEMAS% takes the
// function definitions, one JSON text a line.
constexpr absl::string_view kV32Tools = R"(## Tools

You have access to a set of tools you can use to answer the user's question.
You can invoke functions by writing a "<｜DSML｜function_calls>" block like the following as part of your reply to the user:
<｜DSML｜function_calls>
<｜DSML｜invoke name="$FUNCTION_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$FUNCTION_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜function_calls>

String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects should use JSON format. The "string" attribute should be set to "true" for string type parameters and "false" for other types (numbers, booleans, arrays, objects).

If the thinking_mode is enabled, then after function results you should strongly consider outputting a thinking block. Here is an example:

<｜DSML｜function_calls>
...
</｜DSML｜function_calls>

<function_results>
...
</function_results>

<think>...thinking about results</think>

Here are the functions available in JSONSchema format:
<functions>
%SCHEMAS%
</functions>
)";

constexpr absl::string_view kV4Tools = R"(## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜tool_calls>" block like the following:

<｜DSML｜tool_calls>
<｜DSML｜invoke name="$TOOL_NAME">
<｜DSML｜parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜parameter>
...
</｜DSML｜invoke>
<｜DSML｜invoke name="$TOOL_NAME2">
...
</｜DSML｜invoke>
</｜DSML｜tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

%SCHEMAS%

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
)";

constexpr absl::string_view kV4MaxEffort =
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate step, "
    "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
    "unchecked.\n\n";

// A message as the encoders see it: V4's user turns carry blocks (text and
// tool results) merged from several OpenAI messages.
struct Block {
  bool tool_result = false;
  std::string text;
  std::string tool_call_id;
};
struct Msg {
  std::string role;
  std::string content;
  std::string reasoning;
  std::vector<ChatToolCall> tool_calls;
  std::string tool_call_id;
  bool tools = false;         // the request's tools go after its content
  std::vector<Block> blocks;  // V4's user turns
};

std::string ToolsSection(DsmlDialect dialect, const std::vector<std::string>& schemas) {
  const absl::string_view t = dialect == DsmlDialect::kV32 ? kV32Tools : kV4Tools;
  const size_t at = t.find("%SCHEMAS%");
  return absl::StrCat(t.substr(0, at), absl::StrJoin(schemas, "\n"), t.substr(at + 9));
}

// A call's arguments as DSML parameters, one a line.
absl::StatusOr<std::string> DsmlArguments(DsmlDialect dialect, const ChatToolCall& call) {
  OrderedJson args = OrderedJson::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  if (args.is_discarded() && dialect == DsmlDialect::kV4) {
    args = OrderedJson::object({{"arguments", call.arguments}});  // V4 wraps what is not JSON
  }
  if (!args.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the arguments of the tool call '", call.name, "' are not a JSON object"));
  }
  std::vector<std::string> lines;
  for (const auto& [key, value] : args.items()) {
    const bool is_str = value.is_string();
    lines.push_back(absl::StrCat(
        "<｜DSML｜parameter name=\"", key, "\" string=\"", is_str ? "true" : "false", "\">",
        is_str ? value.get<std::string>() : PythonJsonDumps(value), "</｜DSML｜parameter>"));
  }
  return absl::StrJoin(lines, "\n");
}

// "\n\n<｜DSML｜BLOCK>\n(invokes)\n</｜DSML｜BLOCK>" for `calls`; empty for none.
absl::StatusOr<std::string> DsmlCalls(DsmlDialect dialect, const std::vector<ChatToolCall>& calls) {
  if (calls.empty()) return std::string();
  std::vector<std::string> invokes;
  for (const ChatToolCall& call : calls) {
    absl::StatusOr<std::string> args = DsmlArguments(dialect, call);
    if (!args.ok()) return args.status();
    invokes.push_back(
        absl::StrCat("<｜DSML｜invoke name=\"", call.name, "\">\n", *args, "\n</｜DSML｜invoke>"));
  }
  const absl::string_view block = DsmlBlockName(dialect);
  return absl::StrCat("\n\n<｜DSML｜", block, ">\n", absl::StrJoin(invokes, "\n"), "\n</｜DSML｜",
                      block, ">");
}

int LastUserIndex(const std::vector<Msg>& msgs) {
  for (int i = static_cast<int>(msgs.size()) - 1; i >= 0; --i) {
    if (msgs[i].role == "user") return i;
  }
  return -1;
}

absl::StatusOr<std::string> EncodeV32(const std::vector<Msg>& msgs, const DsmlEncodeOptions& o) {
  const int last_user = LastUserIndex(msgs);
  std::string out(kBos);
  for (int i = 0; i < static_cast<int>(msgs.size()); ++i) {
    const Msg& m = msgs[i];
    if (m.role == "system") {
      out += m.content;
      if (m.tools) absl::StrAppend(&out, "\n\n", ToolsSection(DsmlDialect::kV32, o.tool_schemas));
    } else if (m.role == "user") {
      absl::StrAppend(&out, kUser, m.content, kAssistant,
                      i == last_user && o.thinking ? kThinkStart : kThinkEnd);
    } else if (m.role == "tool") {
      int prev = i - 1;
      while (prev >= 0 && msgs[prev].role == "tool") --prev;
      const int order = i - prev;
      if (prev < 0 || msgs[prev].role != "assistant" ||
          static_cast<int>(msgs[prev].tool_calls.size()) < order) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a tool message answers no tool call (tool messages follow the assistant message "
            "whose tool_calls they answer, one each)"));
      }
      if (order == 1) out += "\n\n<function_results>";
      absl::StrAppend(&out, "\n<result>", m.content, "</result>");
      if (order == static_cast<int>(msgs[prev].tool_calls.size())) {
        absl::StrAppend(&out, "\n</function_results>\n\n",
                        i >= last_user && o.thinking ? kThinkStart : kThinkEnd);
      }
    } else {  // assistant
      absl::StatusOr<std::string> calls = DsmlCalls(DsmlDialect::kV32, m.tool_calls);
      if (!calls.ok()) return calls.status();
      if (o.thinking && i > last_user) {
        if (m.reasoning.empty() && m.tool_calls.empty()) {
          return absl::InvalidArgumentError(
              "in thinking mode an assistant message after the last user message needs "
              "reasoning_content or tool_calls");
        }
        absl::StrAppend(&out, m.reasoning, kThinkEnd);
      }
      absl::StrAppend(&out, m.content, *calls, kEos);
    }
  }
  return out;
}

// V4 has no tool role: tool results become blocks of a user turn, with the
// user text that follows them, sorted by the order of the calls they answer.
std::vector<Msg> MergeToolMessages(std::vector<Msg> msgs) {
  std::vector<Msg> merged;
  for (Msg& m : msgs) {
    if (m.role != "tool" && m.role != "user") {
      merged.push_back(std::move(m));
      continue;
    }
    if (merged.empty() || merged.back().role != "user") {
      Msg user;
      user.role = "user";
      merged.push_back(std::move(user));
    }
    merged.back().blocks.push_back({m.role == "tool", std::move(m.content), m.tool_call_id});
  }
  std::map<std::string, int> order;  // the last assistant's calls, by id
  for (Msg& m : merged) {
    if (m.role == "assistant" && !m.tool_calls.empty()) {
      order.clear();
      for (size_t k = 0; k < m.tool_calls.size(); ++k) {
        if (!m.tool_calls[k].id.empty()) order[m.tool_calls[k].id] = static_cast<int>(k);
      }
    }
    if (m.role != "user" || order.empty()) continue;
    std::vector<Block> results;
    for (const Block& b : m.blocks) {
      if (b.tool_result) results.push_back(b);
    }
    if (results.size() < 2) continue;
    auto rank = [&](const Block& b) {
      auto it = order.find(b.tool_call_id);
      return it == order.end() ? 0 : it->second;
    };
    std::stable_sort(results.begin(), results.end(),
                     [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
    size_t next = 0;
    for (Block& b : m.blocks) {
      if (b.tool_result) b = results[next++];
    }
  }
  return merged;
}

absl::StatusOr<std::string> EncodeV4(std::vector<Msg> input, const DsmlEncodeOptions& o) {
  const std::vector<Msg> msgs = MergeToolMessages(std::move(input));
  // Every turn's reasoning stays once tools are defined.
  const bool drop_thinking = o.tool_schemas.empty();
  const int last_user = LastUserIndex(msgs);
  const int n = static_cast<int>(msgs.size());
  std::string out(kBos);
  if (o.thinking && o.max_reasoning_effort) absl::StrAppend(&out, kV4MaxEffort);
  for (int i = 0; i < n; ++i) {
    const Msg& m = msgs[i];
    if (m.role == "system") {
      out += m.content;
      if (m.tools) absl::StrAppend(&out, "\n\n", ToolsSection(DsmlDialect::kV4, o.tool_schemas));
    } else if (m.role == "user") {
      std::vector<std::string> parts;
      for (const Block& b : m.blocks) {
        parts.push_back(b.tool_result ? absl::StrCat("<tool_result>", b.text, "</tool_result>")
                                      : b.text);
      }
      absl::StrAppend(&out, kUser, absl::StrJoin(parts, "\n\n"));
    } else {  // assistant
      absl::StatusOr<std::string> calls = DsmlCalls(DsmlDialect::kV4, m.tool_calls);
      if (!calls.ok()) return calls.status();
      if (o.thinking && (!drop_thinking || i > last_user)) {
        absl::StrAppend(&out, m.reasoning, kThinkEnd);
      }
      absl::StrAppend(&out, m.content, *calls, kEos);
    }
    // The assistant token (and the thinking switch) only where an assistant
    // turn or the generation follows a user turn.
    const bool next_assistant = i + 1 == n || msgs[i + 1].role == "assistant";
    if (m.role == "user" && next_assistant) {
      absl::StrAppend(&out, kAssistant,
                      o.thinking && (!drop_thinking || i >= last_user) ? kThinkStart : kThinkEnd);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> EncodeDsmlMessages(DsmlDialect dialect,
                                               const std::vector<ChatMessage>& messages,
                                               const DsmlEncodeOptions& options) {
  if (messages.empty()) return absl::InvalidArgumentError("messages is empty");
  std::vector<Msg> msgs;
  // As SGLang serves these models: a system message first, the tools on it.
  if (messages.front().role != "system") {
    Msg system;
    system.role = "system";
    msgs.push_back(std::move(system));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& c = messages[i];
    if (c.role != "system" && c.role != "user" && c.role != "assistant" && c.role != "tool") {
      return absl::InvalidArgumentError(absl::StrCat(
          "messages[", i, "]: a message of role '", c.role,
          "' cannot be rendered by this model's prompt format (system, user, assistant and tool "
          "messages are)"));
    }
    Msg m;
    m.role = c.role;
    m.content = c.content;
    m.reasoning = c.reasoning_content;
    m.tool_calls = c.tool_calls;
    m.tool_call_id = c.tool_call_id;
    msgs.push_back(std::move(m));
  }
  msgs.front().tools = !options.tool_schemas.empty();
  return dialect == DsmlDialect::kV32 ? EncodeV32(msgs, options)
                                      : EncodeV4(std::move(msgs), options);
}

absl::string_view DsmlBlockName(DsmlDialect dialect) {
  return dialect == DsmlDialect::kV32 ? "function_calls" : "tool_calls";
}

std::string PythonJsonDumps(const OrderedJson& value) {
  if (value.is_object()) {
    std::vector<std::string> items;
    for (const auto& [key, v] : value.items()) {
      items.push_back(absl::StrCat(PythonJsonDumps(OrderedJson(key)), ": ", PythonJsonDumps(v)));
    }
    return absl::StrCat("{", absl::StrJoin(items, ", "), "}");
  }
  if (value.is_array()) {
    std::vector<std::string> items;
    for (const OrderedJson& v : value) items.push_back(PythonJsonDumps(v));
    return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
  }
  return value.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

}  // namespace moesh
