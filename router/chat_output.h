// A chat model's generated text split the way OpenAI's chat API reports it:
// reasoning (an R1-style `<think>` ... `</think>` block) into
// `reasoning_content`, DeepSeek's tool-call tokens into `tool_calls`, the
// rest into `content`. Fed the text as it streams, in chunks cut anywhere
// (mid-token, mid-UTF-8 character): a marker split across chunks is held
// back until the next chunk decides it, so the deltas are the same however
// the text was cut.
//
// Tool calls, as DeepSeek-V3/R1 write them:
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n
//   ```json\nARGS\n```<｜tool▁call▁end｜> (more calls, "\n" between) <｜tool▁calls▁end｜>
// A call is reported in pieces as it streams, as OpenAI's are: its id and
// name once its header line (up to the "\n" after NAME) came (arguments ""),
// then its arguments as their text arrives, closed at `<｜tool▁call▁end｜>`
// (or at Finish when cut off, the end of the text standing for it: a begun
// end marker, or closing fence on a line of its own, is dropped). The
// arguments are the text between the fences as written (not re-encoded;
// without fences, the text up to the call's end), whitespace around it
// trimmed; a piece never holds the closing fence, a marker's start or part
// of a UTF-8 character (the text that may become one is held back until the
// next chunk decides it). A call whose header is cut off is content as
// written. Text after `<｜tool▁calls▁end｜>` is content.
//
// Tool calls in DSML, as DeepSeek-V3.2 (BLOCK "function_calls") and V4
// ("tool_calls") write them:
//   \n\n<｜DSML｜BLOCK>\n<｜DSML｜invoke name="NAME">\n
//   <｜DSML｜parameter name="K" string="true|false">V</｜DSML｜parameter>\n ...
//   </｜DSML｜invoke>\n (more invokes) </｜DSML｜BLOCK>
// A call is reported in pieces as it streams: its id and name once its
// header `<｜DSML｜invoke name="NAME">` came (arguments ""), then its arguments
// a parameter at a time, closed at `</｜DSML｜invoke>` (or at Finish when cut
// off): together the JSON object the reference decoder (encoding_dsv32.py's
// decode_dsml_to_arguments) makes, {"K": V, ...} with a string="true" value
// as a JSON string, any other as written, ", " and ": " between. The "\n\n"
// before the block is the format's, not content. An invoke without a name is
// content as written; a parameter it cannot read, or text between
// parameters, is dropped. Not thread-safe.
#ifndef MOESH_ROUTER_CHAT_OUTPUT_H_
#define MOESH_ROUTER_CHAT_OUTPUT_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace moesh {

struct ParsedToolCall {
  int index = 0;  // among this choice's calls
  std::string id;
  std::string name;
  std::string arguments;
};

// What a chunk of text added. A call comes in pieces: its first
// entry carries its index, id and name, later entries of the same index only
// more of its arguments, to be appended; one delta holds at most one entry
// per call.
struct ChatDelta {
  std::string reasoning;
  std::string content;
  std::vector<ParsedToolCall> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class ChatOutputParser {
 public:
  enum class ToolFormat { kDeepSeekV3, kDsml };
  struct Options {
    // Split reasoning off: the text up to `</think>` is reasoning. With
    // `in_reasoning` the text starts inside the block (the prompt opened
    // `<think>`); else only a text that starts with `<think>` has one.
    bool reasoning = false;
    bool in_reasoning = false;
    // Parse tool calls out of the content, written in `tool_format` (kDsml:
    // inside <｜DSML｜dsml_block>).
    bool tools = false;
    ToolFormat tool_format = ToolFormat::kDeepSeekV3;
    std::string dsml_block = "function_calls";
    // Call ids are id_prefix + the call's index.
    std::string id_prefix = "call_";
  };
  explicit ChatOutputParser(Options options);

  ChatDelta Feed(absl::string_view text);
  // The end of the text: what was held back (a tool call cut off before its
  // header was reported goes to content as written; one after it is closed).
  ChatDelta Finish();
  // Calls reported so far.
  int tool_calls() const { return calls_; }

 private:
  enum class State { kMaybeThink, kReasoning, kContent, kTools, kAfterTools };
  // Moves what `pending_` decides into `out`; leaves the undecided tail.
  void Drain(ChatDelta* out);
  // Moves pending_'s text before `marker` into `into` and drops the marker:
  // true. Without the marker, all but a tail that may start it: false.
  bool TakeUntil(absl::string_view marker, std::string* into);
  // kTools (V3): the next call's header (or the calls' end) out of pending_;
  // false when pending_ does not hold it whole yet.
  bool TakeCall(ChatDelta* out);
  // kTools (V3), inside a call (open_call_): what pending_ decides of its
  // arguments; true once the call ended (pending_ then past its end marker).
  bool TakeCallArguments(ChatDelta* out);
  // TakeCall for DSML.
  bool TakeDsmlCall(ChatDelta* out);
  // kContent with DSML calls: the content before the block's opening (less
  // the "\n\n" before it); true once the opening was taken.
  bool TakeDsmlContent(ChatDelta* out);
  // kTools with DSML, inside a call (open_call_): its next parameter or its
  // end, `start` the first byte of pending_ that is not whitespace.
  bool TakeDsmlParameter(ChatDelta* out, size_t start);
  // A parameter's text (after `<｜DSML｜parameter`, before its end) as
  // `"K": V`; false when it cannot be read.
  static bool ParameterJson(absl::string_view param, std::string* json);
  // Appends `piece` to out's calls, or to the last one's arguments when it
  // continues that call.
  static void AddCallPiece(ChatDelta* out, ParsedToolCall piece);

  const Options options_;
  const std::string dsml_open_;   // <｜DSML｜BLOCK>
  const std::string dsml_close_;  // </｜DSML｜BLOCK>
  State state_;
  std::string pending_;
  std::string raw_tools_;  // kTools: the opening marker until a call is taken
  int calls_ = 0;
  bool open_call_ = false;  // a call's header was reported, not its end
  int call_params_ = 0;     // DSML: the open call's parameters reported
  // V3: where the open call's arguments are: before their opening fence,
  // in the whitespace after it, or in their text.
  enum class Args { kOpening, kLeading, kText };
  Args args_ = Args::kOpening;
  bool fenced_ = false;  // V3: the open call's arguments opened with ```
};

}  // namespace moesh

#endif  // MOESH_ROUTER_CHAT_OUTPUT_H_
