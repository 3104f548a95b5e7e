#include "router/chat_output.h"

#include <string>

#include "common/tokenizer/utf8.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

constexpr char kCall1[] =
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"
    "<｜tool▁call▁end｜>";
constexpr char kCall2[] =
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>lookup\n```json\n{\"q\": [1, 2]}\n```"
    "<｜tool▁call▁end｜>";

// Everything the parser reported, summed over deltas.
struct Total {
  std::string reasoning, content;
  std::vector<ParsedToolCall> calls;
  // Calls in pieces (DSML) are joined: one entry per call.
  void Add(const ChatDelta& d) {
    reasoning += d.reasoning;
    content += d.content;
    for (const ParsedToolCall& t : d.tool_calls) {
      if (!calls.empty() && calls.back().index == t.index) {
        EXPECT_TRUE(t.id.empty() && t.name.empty()) << "a call's later piece names it again";
        calls.back().arguments += t.arguments;
      } else {
        EXPECT_FALSE(t.id.empty()) << "a call's first piece has no id";
        calls.push_back(t);
      }
    }
  }
};

Total ParseChunks(const ChatOutputParser::Options& o, const std::vector<std::string>& chunks) {
  ChatOutputParser p(o);
  Total t;
  for (const std::string& c : chunks) t.Add(p.Feed(c));
  t.Add(p.Finish());
  return t;
}

void ExpectSame(const Total& a, const Total& b, const std::string& where) {
  EXPECT_EQ(a.reasoning, b.reasoning) << where;
  EXPECT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << where;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].index, b.calls[i].index) << where;
    EXPECT_EQ(a.calls[i].id, b.calls[i].id) << where;
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << where;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << where;
  }
}

// The text cut at every byte (two chunks), and byte by byte, reports what
// the whole text reports; returns the latter.
Total ParseEveryCut(const ChatOutputParser::Options& o, const std::string& text) {
  const Total whole = ParseChunks(o, {text});
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ExpectSame(ParseChunks(o, {text.substr(0, cut), text.substr(cut)}), whole,
               "cut at " + std::to_string(cut));
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  ExpectSame(ParseChunks(o, bytes), whole, "byte by byte");
  return whole;
}

ChatOutputParser::Options R1(bool tools) {
  ChatOutputParser::Options o;
  o.reasoning = true;
  o.in_reasoning = true;
  o.tools = tools;
  o.id_prefix = "call_x_";
  return o;
}

TEST(ChatOutputParserTest, ReasoningThenContent) {
  const Total t = ParseEveryCut(R1(false), "Let me think.\nOK</think>\n\nThe answer is 4.");
  EXPECT_EQ(t.reasoning, "Let me think.\nOK");
  EXPECT_EQ(t.content, "\n\nThe answer is 4.");
  EXPECT_TRUE(t.calls.empty());
}

TEST(ChatOutputParserTest, UnfinishedReasoningStaysReasoning) {
  const Total t = ParseEveryCut(R1(false), "still thinking </thi");
  EXPECT_EQ(t.reasoning, "still thinking </thi");
  EXPECT_EQ(t.content, "");
}

TEST(ChatOutputParserTest, ThinkBlockOnlyWhenTheTextOpensIt) {
  ChatOutputParser::Options o = R1(false);
  o.in_reasoning = false;
  Total t = ParseEveryCut(o, "<think>hmm</think>yes");
  EXPECT_EQ(t.reasoning, "hmm");
  EXPECT_EQ(t.content, "yes");
  t = ParseEveryCut(o, "no block </think> here");
  EXPECT_EQ(t.reasoning, "");
  EXPECT_EQ(t.content, "no block </think> here");
  t = ParseEveryCut(o, "<thin");
  EXPECT_EQ(t.content, "<thin");
}

TEST(ChatOutputParserTest, WithoutOptionsEverythingIsContent) {
  const std::string text = std::string("a</think>b<｜tool▁calls▁begin｜>") + kCall1;
  const Total t = ParseEveryCut({}, text);
  EXPECT_EQ(t.content, text);
  EXPECT_EQ(t.reasoning, "");
  EXPECT_TRUE(t.calls.empty());
}

TEST(ChatOutputParserTest, ToolCallsAfterReasoning) {
  const std::string text = std::string("need weather</think>Checking.<｜tool▁calls▁begin｜>") +
                           kCall1 + "\n" + kCall2 + "<｜tool▁calls▁end｜>";
  const Total t = ParseEveryCut(R1(true), text);
  EXPECT_EQ(t.reasoning, "need weather");
  EXPECT_EQ(t.content, "Checking.");
  ASSERT_EQ(t.calls.size(), 2u);
  EXPECT_EQ(t.calls[0].index, 0);
  EXPECT_EQ(t.calls[0].id, "call_x_0");
  EXPECT_EQ(t.calls[0].name, "get_weather");
  EXPECT_EQ(t.calls[0].arguments, "{\"city\": \"Paris\"}");
  EXPECT_EQ(t.calls[1].index, 1);
  EXPECT_EQ(t.calls[1].id, "call_x_1");
  EXPECT_EQ(t.calls[1].name, "lookup");
  EXPECT_EQ(t.calls[1].arguments, "{\"q\": [1, 2]}");
}

TEST(ChatOutputParserTest, ToolCallsWithoutFencesOrReasoning) {
  ChatOutputParser::Options o;
  o.tools = true;
  const Total t =
      ParseEveryCut(o,
                    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{}"
                    "<｜tool▁call▁end｜><｜tool▁calls▁end｜> tail");
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.calls[0].name, "f");
  EXPECT_EQ(t.calls[0].arguments, "{}");
  EXPECT_EQ(t.content, " tail");
}

TEST(ChatOutputParserTest, CallCutOffInItsHeaderIsContentAsWritten) {
  ChatOutputParser::Options o;
  o.tools = true;
  const std::string tail = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>ge";
  Total t = ParseEveryCut(o, "pre " + tail);
  EXPECT_TRUE(t.calls.empty());
  EXPECT_EQ(t.content, "pre " + tail);
  // A finished call stays a call; only the unfinished one is content.
  t = ParseEveryCut(o, std::string("<｜tool▁calls▁begin｜>") + kCall1 + "\n<｜tool▁call▁begin｜>g");
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.content, "\n<｜tool▁call▁begin｜>g");
}

TEST(ChatOutputParserTest, CallCutOffAfterItsHeaderIsClosed) {
  // The text ends mid-call (max_tokens): the call was reported at its header;
  // its arguments are what came, less the format's fence and end marker.
  ChatOutputParser::Options o;
  o.tools = true;
  const std::string head =
      "pre <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n";
  for (const auto& [text, arguments] : std::vector<std::pair<std::string, std::string>>{
           {"", ""},
           {"```js", "js"},  // as the whole call's text reads
           {"```json\n{\"city\": \"Par", "{\"city\": \"Par"},
           {"```json\n{\"city\": \"P\xC3", "{\"city\": \"P\xC3"},  // the text's own bytes
           {"```json\n{\"a\": 1}\n``", "{\"a\": 1}"},
           {"```json\n{\"a\": 1}\n```<｜tool▁call▁e", "{\"a\": 1}"},
           {"{\"a\": 1}  ", "{\"a\": 1}"}}) {
    const Total t = ParseEveryCut(o, head + text);
    ASSERT_EQ(t.calls.size(), 1u) << text;
    EXPECT_EQ(t.calls[0].name, "get_weather");
    EXPECT_EQ(t.calls[0].arguments, arguments) << text;
    EXPECT_EQ(t.content, "pre ") << text;
  }
}

// Every cut of `text`: each piece of a call's arguments is well-formed UTF-8
// and holds neither a fence nor a special token's bar.
void ExpectCleanPieces(const ChatOutputParser::Options& o, const std::string& text) {
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ChatOutputParser p(o);
    std::vector<ChatDelta> deltas = {p.Feed(text.substr(0, cut)), p.Feed(text.substr(cut)),
                                     p.Finish()};
    for (const ChatDelta& d : deltas) {
      for (const ParsedToolCall& t : d.tool_calls) {
        EXPECT_TRUE(ValidateUtf8(t.arguments).ok()) << "cut at " << cut << ": " << t.arguments;
        EXPECT_EQ(t.arguments.find("```"), std::string::npos) << "cut at " << cut;
        EXPECT_EQ(t.arguments.find("｜"), std::string::npos) << "cut at " << cut;
      }
    }
  }
}

TEST(ChatOutputParserTest, CallsStreamInPieces) {
  ChatOutputParser::Options o = R1(true);
  ChatOutputParser p(o);
  ChatDelta d =
      p.Feed("ok</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>");
  EXPECT_EQ(d.reasoning, "ok");
  EXPECT_TRUE(d.tool_calls.empty());
  // The header: index, id and name, no arguments yet.
  d = p.Feed("get_weather\n```js");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_EQ(d.tool_calls[0].id, "call_x_0");
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].arguments, "");
  EXPECT_TRUE(p.Feed("on\n").empty());
  // The arguments as they come, less what may still be the fence, the end
  // marker or part of a character ("é" is two bytes).
  d = p.Feed("{\"city\": \"Par");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_TRUE(d.tool_calls[0].id.empty() && d.tool_calls[0].name.empty());
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"city\": \"Par");
  d = p.Feed("is\xC3");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "is");
  d = p.Feed("\xA9\"}\n`");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "é\"}");
  EXPECT_TRUE(p.Feed("``<｜tool▁call").empty());
  EXPECT_TRUE(p.Feed("▁end｜>").empty());  // closed: nothing was left to add
  // The next call: its header, then its arguments.
  d = p.Feed("\n" + std::string(kCall2));
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].index, 1);
  EXPECT_EQ(d.tool_calls[0].name, "lookup");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"q\": [1, 2]}");
  EXPECT_EQ(p.Feed("<｜tool▁calls▁end｜> done").content, " done");
  EXPECT_TRUE(p.Finish().empty());
  EXPECT_EQ(p.tool_calls(), 2);
}

TEST(ChatOutputParserTest, CallArgumentsStreamAtEveryCutAsWhole) {
  ChatOutputParser::Options o;
  o.tools = true;
  const std::string call = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n";
  const std::string end = "<｜tool▁call▁end｜>";
  // Arguments with backticks, markers' look-alikes and multi-byte characters.
  for (const auto& [args, arguments] : std::vector<std::pair<std::string, std::string>>{
           {"```json\n{\"s\": \"a`b`` ```c\", \"t\": \"<｜x｜> é€😀\"}\n```",
            "{\"s\": \"a`b`` ```c\", \"t\": \"<｜x｜> é€😀\"}"},
           {"  ```json  \n [1]\n```\n", "[1]"},
           {"```\n{}\n```", "{}"},
           {"```jsonx```", "x"},
           {"````", "`"},
           {"```json```", ""},
           {"{\"a\": \"``\"}\n``", "{\"a\": \"``\"}\n``"},  // no fences: as written
           {"", ""}}) {
    const std::string text =
        "<｜tool▁calls▁begin｜>" + call + args + end + "<｜tool▁calls▁end｜>after";
    const Total t = ParseEveryCut(o, text);
    ASSERT_EQ(t.calls.size(), 1u) << args;
    EXPECT_EQ(t.calls[0].name, "f");
    EXPECT_EQ(t.calls[0].arguments, arguments) << args;
    EXPECT_EQ(t.content, "after") << args;
  }
  ExpectCleanPieces(o, "<｜tool▁calls▁begin｜>" + call + "```json\n{\"t\": \"é€😀 ``\"}\n```" + end +
                           "\n" + call + "```json\n{\"u\": \"ü\"}\n```" + end +
                           "<｜tool▁calls▁end｜>");
  // A call without arguments, its end right after its name.
  const Total bare = ParseEveryCut(
      o, "<｜tool▁calls▁begin｜>" + call.substr(0, call.size() - 1) + end + "<｜tool▁calls▁end｜>");
  ASSERT_EQ(bare.calls.size(), 1u);
  EXPECT_EQ(bare.calls[0].name, "f");
  EXPECT_EQ(bare.calls[0].arguments, "");
}

TEST(ChatOutputParserTest, DeltasComeAsSoonAsDecided) {
  ChatOutputParser p(R1(true));
  EXPECT_EQ(p.Feed("abc</th").reasoning, "abc");
  ChatDelta d = p.Feed("ink>hi <｜tool");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "hi ");
  d = p.Feed("▁calls▁begin｜>");
  EXPECT_TRUE(d.empty());
  d = p.Feed(kCall1);
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(p.tool_calls(), 1);
  EXPECT_TRUE(p.Finish().empty());
}

// DSML (DeepSeek-V3.2: "function_calls", V4: "tool_calls").
constexpr char kInvokeParis[] =
    "<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>";
constexpr char kInvokeRome[] =
    "<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"city\" string=\"true\">Rome</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"units\" string=\"false\">[\"C\", \"F\"]</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>";

ChatOutputParser::Options Dsml(const std::string& block, bool thinking) {
  ChatOutputParser::Options o;
  o.reasoning = thinking;
  o.in_reasoning = thinking;
  o.tools = true;
  o.tool_format = ChatOutputParser::ToolFormat::kDsml;
  o.dsml_block = block;
  return o;
}

std::string Block(const std::string& block, const std::vector<std::string>& invokes) {
  std::string text = "\n\n<｜DSML｜" + block + ">\n";
  for (size_t i = 0; i < invokes.size(); ++i) text += (i ? "\n" : "") + invokes[i];
  return text + "\n</｜DSML｜" + block + ">";
}

TEST(ChatOutputParserTest, DsmlCallsAfterContent) {
  const Total t =
      ParseEveryCut(Dsml("function_calls", false),
                    "Let me check." + Block("function_calls", {kInvokeParis, kInvokeRome}));
  EXPECT_EQ(t.reasoning, "");
  EXPECT_EQ(t.content, "Let me check.");
  ASSERT_EQ(t.calls.size(), 2u);
  EXPECT_EQ(t.calls[0].name, "get_weather");
  EXPECT_EQ(t.calls[0].arguments, R"({"city": "Paris"})");
  EXPECT_EQ(t.calls[0].id, "call_0");
  EXPECT_EQ(t.calls[1].index, 1);
  EXPECT_EQ(t.calls[1].arguments, R"({"city": "Rome", "days": 2, "units": ["C", "F"]})");
}

TEST(ChatOutputParserTest, DsmlThinkingThenCallsV4) {
  const Total t = ParseEveryCut(Dsml("tool_calls", true),
                                "Need Paris.</think>" + Block("tool_calls", {kInvokeParis}));
  EXPECT_EQ(t.reasoning, "Need Paris.");
  EXPECT_EQ(t.content, "");
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.calls[0].arguments, R"({"city": "Paris"})");
  // V3.2's block name is content to a V4 parser, and the other way round.
  const Total other =
      ParseEveryCut(Dsml("tool_calls", false), Block("function_calls", {kInvokeParis}));
  EXPECT_TRUE(other.calls.empty());
  EXPECT_EQ(other.content, Block("function_calls", {kInvokeParis}));
}

TEST(ChatOutputParserTest, DsmlStringValuesBecomeJsonStrings) {
  const std::string invoke =
      "<｜DSML｜invoke name=\"say\">\n"
      "<｜DSML｜parameter name=\"text\" string=\"true\">a \"quote\"\n\\ é</｜DSML｜parameter>\n"
      "<｜DSML｜parameter name=\"n\" string=\"false\">{\"k\": null}</｜DSML｜parameter>\n"
      "</｜DSML｜invoke>";
  const Total t = ParseEveryCut(Dsml("function_calls", false), Block("function_calls", {invoke}));
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.calls[0].name, "say");
  EXPECT_EQ(t.calls[0].arguments, R"({"text": "a \"quote\"\n\\ é", "n": {"k": null}})");
  // No parameters: an empty object.
  const Total none =
      ParseEveryCut(Dsml("function_calls", false),
                    Block("function_calls", {"<｜DSML｜invoke name=\"now\">\n</｜DSML｜invoke>"}));
  ASSERT_EQ(none.calls.size(), 1u);
  EXPECT_EQ(none.calls[0].arguments, "{}");
}

TEST(ChatOutputParserTest, DsmlNewlinesWithoutBlockStayContent) {
  Total t = ParseEveryCut(Dsml("function_calls", false), "a\n\nb\n\n<｜DSML｜funct");
  EXPECT_EQ(t.content, "a\n\nb\n\n<｜DSML｜funct");
  EXPECT_TRUE(t.calls.empty());
  // The block without the blank line before it is still a block.
  t = ParseEveryCut(
      Dsml("function_calls", false),
      "x<｜DSML｜function_calls>\n" + std::string(kInvokeParis) + "\n</｜DSML｜function_calls>");
  EXPECT_EQ(t.content, "x");
  ASSERT_EQ(t.calls.size(), 1u);
}

TEST(ChatOutputParserTest, DsmlUnfinishedOrMalformedCalls) {
  const ChatOutputParser::Options o = Dsml("function_calls", false);
  const std::string open = "\n\n<｜DSML｜function_calls>\n";
  // Cut off inside the call's header: no call, the text as written.
  const std::string half = open + "<｜DSML｜invoke name=\"get_wea";
  Total t = ParseEveryCut(o, "pre" + half);
  EXPECT_TRUE(t.calls.empty());
  EXPECT_EQ(t.content, "pre" + half);
  // Cut off after it: the call (reported at its header) is closed.
  t = ParseEveryCut(o, "pre" + open + "<｜DSML｜invoke name=\"get_weather\">\n<｜DSML｜param");
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.calls[0].arguments, "{}");
  EXPECT_EQ(t.content, "pre\n<｜DSML｜param");
  // Text between parameters is dropped; an unreadable parameter too.
  t = ParseEveryCut(o, open + "<｜DSML｜invoke name=\"f\">\njunk<｜DSML｜parameter oops" +
                           "</｜DSML｜parameter>\n<｜DSML｜parameter name=\"a\" string=\"true\">1" +
                           "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>");
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.calls[0].arguments, R"({"a": "1"})");
  EXPECT_EQ(t.content, "");
  // A finished call stays a call; the unfinished one after it is content.
  t = ParseEveryCut(o, open + kInvokeParis + "\n<｜DSML｜invoke name=\"g");
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.content, "\n<｜DSML｜invoke name=\"g");
  // An invoke without a name is content as written; later calls still parse.
  const std::string bad = "<｜DSML｜invoke>\n</｜DSML｜invoke>";
  t = ParseEveryCut(o, open + bad + "\n" + kInvokeParis + "\n</｜DSML｜function_calls>");
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.calls[0].index, 0);
  EXPECT_EQ(t.content, open + bad);
}

TEST(ChatOutputParserTest, DsmlCallsStreamInPieces) {
  // tool_choice naming a function: the prompt opened the call; its header is
  // the call's first piece.
  ChatOutputParser p(Dsml("function_calls", true));
  ChatDelta d =
      p.Feed("</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_weather\">\n");
  EXPECT_TRUE(d.reasoning.empty() && d.content.empty());
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].id, "call_0");
  EXPECT_EQ(d.tool_calls[0].arguments, "");
  d = p.Feed("<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜param");
  EXPECT_TRUE(d.empty());
  d = p.Feed("eter>\n<｜DSML｜parameter name=\"days\" string=\"false\">3</｜DSML｜parameter>");
  ASSERT_EQ(d.tool_calls.size(), 1u);  // two parameters, one piece
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_TRUE(d.tool_calls[0].id.empty() && d.tool_calls[0].name.empty());
  EXPECT_EQ(d.tool_calls[0].arguments, R"({"city": "Oslo", "days": 3)");
  d = p.Feed("\n</｜DSML｜invoke>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].arguments, "}");
  EXPECT_TRUE(p.Feed("\n</｜DSML｜function_calls>").empty());
  EXPECT_TRUE(p.Finish().empty());
  EXPECT_EQ(p.tool_calls(), 1);
}

TEST(ChatOutputParserTest, DsmlCallCutOffIsClosed) {
  // The text ends mid-call (max_tokens): the call's arguments are closed, the
  // unfinished parameter is content.
  const Total t = ParseEveryCut(
      Dsml("tool_calls", false),
      "\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n"
      "<｜DSML｜parameter name=\"a\" string=\"false\">1</｜DSML｜parameter>\n<｜DSML｜para");
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.calls[0].arguments, R"({"a": 1})");
  EXPECT_EQ(t.content, "\n<｜DSML｜para");
}

}  // namespace
}  // namespace moesh
