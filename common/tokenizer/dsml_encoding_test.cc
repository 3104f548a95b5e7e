#include "common/tokenizer/dsml_encoding.h"

#include <string>
#include <vector>

#include "base/file_util.h"
#include "common/tokenizer/chat_template.h"
#include "common/tokenizer/test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace moesh {
namespace {

using OrderedJson = nlohmann::ordered_json;
using testing_util::ReadOrDie;

const std::string kDir = std::string(MOESH_REPO_DIR) + "/tests/golden/dsml_encoding/";

// An OpenAI message (cases.json) as the router parses it.
ChatMessage ToMessage(const OrderedJson& m) {
  ChatMessage c;
  c.role = m["role"].get<std::string>();
  if (m.contains("content") && m["content"].is_string()) c.content = m["content"];
  c.content_null = !m.contains("content") || m["content"].is_null();
  if (m.contains("reasoning_content")) c.reasoning_content = m["reasoning_content"];
  if (m.contains("tool_call_id")) c.tool_call_id = m["tool_call_id"];
  if (m.contains("tool_calls")) {
    c.has_tool_calls = true;
    for (const OrderedJson& t : m["tool_calls"]) {
      ChatToolCall call;
      call.id = t.value("id", "");
      call.name = t["function"]["name"];
      call.arguments = t["function"]["arguments"];
      c.tool_calls.push_back(call);
    }
  }
  return c;
}

// Every case of cases.json renders its expected file byte for byte.
TEST(DsmlEncodingTest, Goldens) {
  const OrderedJson cases = OrderedJson::parse(ReadOrDie(kDir + "cases.json"));
  ASSERT_GE(cases.size(), 10u);
  for (const OrderedJson& c : cases) {
    const std::string name = c["name"];
    std::vector<ChatMessage> messages;
    for (const OrderedJson& m : c["messages"]) messages.push_back(ToMessage(m));
    DsmlEncodeOptions o;
    o.thinking = c.value("thinking", false);
    o.max_reasoning_effort = c.value("reasoning_effort", "") == "max";
    if (c.contains("tools")) {
      for (const OrderedJson& t : c["tools"])
        o.tool_schemas.push_back(PythonJsonDumps(t["function"]));
    }
    const DsmlDialect dialect = c["dialect"] == "v3.2" ? DsmlDialect::kV32 : DsmlDialect::kV4;
    absl::StatusOr<std::string> got = EncodeDsmlMessages(dialect, messages, o);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status();
    EXPECT_EQ(*got, ReadOrDie(kDir + name + ".txt")) << name;
  }
}

TEST(DsmlEncodingTest, PythonJsonDumpsKeepsOrderAndSpacing) {
  const OrderedJson j = OrderedJson::parse(
      R"({"z": 1, "a": [1.5, true, null, "é\n\"x\""], "m": {}, "e": [], "n": -2e-7})");
  EXPECT_EQ(PythonJsonDumps(j),
            R"({"z": 1, "a": [1.5, true, null, "é\n\"x\""], "m": {}, "e": [], "n": -2e-07})");
}

TEST(DsmlEncodingTest, RefusesWhatTheReferenceRefuses) {
  DsmlEncodeOptions o;
  EXPECT_FALSE(EncodeDsmlMessages(DsmlDialect::kV32, {}, o).ok());
  // A tool message with no call to answer.
  EXPECT_FALSE(EncodeDsmlMessages(DsmlDialect::kV32, {{"user", "hi"}, {"tool", "42"}}, o).ok());
  // More results than calls.
  ChatMessage call("assistant", "");
  call.tool_calls.push_back({"c0", "function", "f", "{}"});
  EXPECT_TRUE(EncodeDsmlMessages(DsmlDialect::kV32, {{"user", "hi"}, call, {"tool", "1"}}, o).ok());
  EXPECT_FALSE(
      EncodeDsmlMessages(DsmlDialect::kV32, {{"user", "hi"}, call, {"tool", "1"}, {"tool", "2"}}, o)
          .ok());
  // Arguments that are not a JSON object: V3.2 refuses, V4 wraps them.
  call.tool_calls[0].arguments = "not json";
  EXPECT_FALSE(EncodeDsmlMessages(DsmlDialect::kV32, {{"user", "hi"}, call}, o).ok());
  absl::StatusOr<std::string> v4 = EncodeDsmlMessages(DsmlDialect::kV4, {{"user", "hi"}, call}, o);
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_NE(v4->find("<｜DSML｜parameter name=\"arguments\" string=\"true\">not json<"),
            std::string::npos)
      << *v4;
  // Thinking: an answer after the last user turn needs its reasoning.
  o.thinking = true;
  EXPECT_FALSE(
      EncodeDsmlMessages(DsmlDialect::kV32, {{"user", "hi"}, {"assistant", "hello"}}, o).ok());
  EXPECT_FALSE(EncodeDsmlMessages(DsmlDialect::kV32, {{"function", "x"}}, o).ok());
}

// The chat template of a V3.2 or V4 checkpoint without one is its encoder.
TEST(DsmlEncodingTest, LoadPicksTheEncoderByModelType) {
  const std::string dir = ::testing::TempDir() + "/dsml_load";
  ASSERT_TRUE(MakeDirs(dir).ok());
  ASSERT_TRUE(
      WriteStringToFile(dir + "/tokenizer_config.json", DeepSeekTokenizerConfigJson(false)).ok());
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Load(dir, "deepseek_v32");
  ASSERT_TRUE(t.ok() && *t != nullptr);
  EXPECT_EQ((*t)->family(), ChatTemplate::Family::kV32);
  EXPECT_TRUE((*t)->dsml() && (*t)->supports_tools());
  absl::StatusOr<std::string> p = (*t)->Render({{"user", "hi"}}, true);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p, "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜></think>");
  t = ChatTemplate::Load(dir, "deepseek_v4");
  ASSERT_TRUE(t.ok() && *t != nullptr);
  EXPECT_EQ((*t)->family(), ChatTemplate::Family::kV4);
  t = ChatTemplate::Load(dir, "deepseek_v3");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(*t, nullptr);
  // A template the checkpoint ships wins.
  ASSERT_TRUE(
      WriteStringToFile(dir + "/tokenizer_config.json", DeepSeekTokenizerConfigJson(true)).ok());
  t = ChatTemplate::Load(dir, "deepseek_v32");
  ASSERT_TRUE(t.ok() && *t != nullptr);
  EXPECT_EQ((*t)->family(), ChatTemplate::Family::kV3);
}

}  // namespace
}  // namespace moesh
