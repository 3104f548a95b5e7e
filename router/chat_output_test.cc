#include "router/chat_output.h"

#include <string>

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
  void Add(const ChatDelta& d) {
    reasoning += d.reasoning;
    content += d.content;
    calls.insert(calls.end(), d.tool_calls.begin(), d.tool_calls.end());
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

TEST(ChatOutputParserTest, UnfinishedCallIsContentAsWritten) {
  ChatOutputParser::Options o;
  o.tools = true;
  const std::string tail = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{";
  Total t = ParseEveryCut(o, "pre " + tail);
  EXPECT_TRUE(t.calls.empty());
  EXPECT_EQ(t.content, "pre " + tail);
  // A finished call stays a call; only the unfinished one is content.
  t = ParseEveryCut(o, std::string("<｜tool▁calls▁begin｜>") + kCall1 + "\n<｜tool▁call▁begin｜>g");
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.content, "\n<｜tool▁call▁begin｜>g");
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

}  // namespace
}  // namespace moesh
