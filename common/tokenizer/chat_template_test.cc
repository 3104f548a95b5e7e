#include "common/tokenizer/chat_template.h"

#include <filesystem>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "common/tokenizer/dsml_encoding.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

#ifndef MOESH_REPO_DIR
#define MOESH_REPO_DIR "."
#endif

namespace moesh {
namespace {

constexpr char kBos[] = "<｜begin▁of▁sentence｜>";
constexpr char kEos[] = "<｜end▁of▁sentence｜>";

// DeepSeek-V2-Chat's template (tokenizer_config.json), for the v2 renderer.
constexpr char kV2Template[] =
    R"jinja({% if not add_generation_prompt is defined %})jinja"
    R"jinja({% set add_generation_prompt = false %}{% endif %}{{ bos_token }})jinja"
    R"jinja({% for message in messages %}{% if message['role'] == 'user' %})jinja"
    R"jinja({{ 'User: ' + message['content'] + '\n\n' }})jinja"
    R"jinja({% elif message['role'] == 'assistant' %})jinja"
    R"jinja({{ 'Assistant: ' + message['content'] + eos_token }})jinja"
    R"jinja({% elif message['role'] == 'system' %}{{ message['content'] + '\n\n' }})jinja"
    R"jinja({% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }})jinja"
    R"jinja({% endif %})jinja";

struct Case {
  std::vector<ChatMessage> messages;
  bool add_generation_prompt;
  std::string v3;  // jinja2 3.1's rendering of kDeepSeekV3ChatTemplate (the release's)
  std::string v2;  // and of kV2Template
};

// Goldens: jinja2.Environment().from_string(template).render(messages=...,
// add_generation_prompt=..., bos_token=kBos, eos_token=kEos), as
// transformers' apply_chat_template renders.
std::vector<Case> Cases() {
  return {
      {{{"user", "Hi"}},
       true,
       "<｜begin▁of▁sentence｜><｜User｜>Hi<｜Assistant｜>",
       "<｜begin▁of▁sentence｜>User: Hi\n\nAssistant:"},
      {{{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "2+2?"}},
       true,
       "<｜begin▁of▁sentence｜>Be "
       "brief.<｜User｜>Hi<｜Assistant｜>Hello!<｜end▁of▁sentence｜><｜User｜>"
       "2+2?<｜Assistant｜>",
       "<｜begin▁of▁sentence｜>Be brief.\n\nUser: Hi\n\nAssistant: "
       "Hello!<｜end▁of▁sentence｜>User: 2+2?\n\nAssistant:"},
      {{{"system", "A"}, {"user", "u"}, {"system", "B"}},
       false,
       "<｜begin▁of▁sentence｜>A\n\nB<｜User｜>u",
       "<｜begin▁of▁sentence｜>A\n\nUser: u\n\nB\n\n"},
  };
}

// A V3-style template without DeepSeek's tool branches (as some fine-tunes
// ship): it renders chats but no tool messages.
constexpr char kV3WithoutTools[] =
    "{{ bos_token }}{%- for message in messages %}{%- if message['role'] == 'user' %}"
    "{{'<｜User｜>' + message['content']}}{%- endif %}{%- if message['role'] == 'assistant' %}"
    "{{'<｜Assistant｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}{%- endif %}"
    "{%- endfor -%}{% if add_generation_prompt %}{{'<｜Assistant｜>'}}{% endif %}";

TEST(ChatTemplateTest, V3MatchesJinja) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t =
      ChatTemplate::FromText(kDeepSeekV3ChatTemplate, kBos, kEos);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->family(), ChatTemplate::Family::kV3);
  for (const Case& c : Cases()) {
    absl::StatusOr<std::string> s = (*t)->Render(c.messages, c.add_generation_prompt);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(*s, c.v3);
  }
}

TEST(ChatTemplateTest, V2MatchesJinja) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromText(kV2Template, kBos, kEos);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->family(), ChatTemplate::Family::kV2);
  for (const Case& c : Cases()) {
    absl::StatusOr<std::string> s = (*t)->Render(c.messages, c.add_generation_prompt);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(*s, c.v2);
  }
}

TEST(ChatTemplateTest, R1DropsReasoningFromHistory) {
  absl::StatusOr<std::string> r1 = ReadFileToString(
      std::string(MOESH_REPO_DIR) + "/tests/golden/chat_template/deepseek_r1.jinja");
  ASSERT_TRUE(r1.ok()) << r1.status();
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromText(*r1, kBos, kEos);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->family(), ChatTemplate::Family::kR1);
  absl::StatusOr<std::string> s =
      (*t)->Render({{"user", "q"}, {"assistant", "<think>x</think>y"}, {"user", "r"}}, true);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s,
            "<｜begin▁of▁sentence｜><｜User｜>q<｜Assistant｜>y<｜end▁of▁sentence｜><｜User｜>r"
            "<｜Assistant｜><think>\n");
}

TEST(ChatTemplateTest, RefusesWhatItCannotRender) {
  absl::Status bad = ChatTemplate::FromText("{{ messages }}\n{% if %}", kBos, kEos).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("line 2"), std::string::npos) << bad;
  auto t = ChatTemplate::FromText(kV3WithoutTools, kBos, kEos);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->Render({}, true).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status tool = (*t)->Render({{"tool", "42"}}, true).status();
  EXPECT_EQ(tool.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tool.message().find("'tool'"), std::string::npos) << tool;
  // raise_exception: the template's own words.
  auto strict = ChatTemplate::FromText(
      "{% if messages[0].role != 'user' %}{{ raise_exception('first a user turn') }}{% endif %}",
      kBos, kEos);
  ASSERT_TRUE(strict.ok()) << strict.status();
  EXPECT_EQ((*strict)->family(), ChatTemplate::Family::kOther);
  absl::Status raised = (*strict)->Render({{"assistant", "x"}}, true).status();
  EXPECT_EQ(raised.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(raised.message().find("first a user turn"), std::string::npos) << raised;
}

// tests/golden/chat_template/: the shipped V3, R1 and V2 templates, a
// ChatML template with tools, and jinja2's renderings of them
// (make_chat_goldens.py).
std::string ChatGoldenPath(const std::string& name) {
  return std::string(MOESH_REPO_DIR) + "/tests/golden/chat_template/" + name;
}

ChatMessage FromJson(const nlohmann::json& j) {
  ChatMessage m;
  m.role = j.at("role").get<std::string>();
  if (j.contains("content") && j["content"].is_string()) {
    m.content = j["content"].get<std::string>();
  } else {
    m.content_null = true;
  }
  if (j.contains("tool_calls")) {
    m.has_tool_calls = true;
    for (const nlohmann::json& c : j["tool_calls"]) {
      m.tool_calls.push_back({c.at("id").get<std::string>(), c.at("type").get<std::string>(),
                              c.at("function").at("name").get<std::string>(),
                              c.at("function").at("arguments").get<std::string>()});
    }
  }
  return m;
}

TEST(ChatTemplateTest, ShippedTemplatesMatchJinjaGoldens) {
  absl::StatusOr<std::string> goldens = ReadFileToString(ChatGoldenPath("goldens.json"));
  ASSERT_TRUE(goldens.ok()) << goldens.status();
  const nlohmann::json cases = nlohmann::json::parse(*goldens).at("cases");
  // The tools' keys in the order the file has them (json sorts its keys).
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(*goldens).at("cases");
  ASSERT_GE(cases.size(), 9u);
  for (const auto& [family, file, expected_family, tools] :
       {std::make_tuple("v3", "deepseek_v3.jinja", ChatTemplate::Family::kV3, true),
        std::make_tuple("r1", "deepseek_r1.jinja", ChatTemplate::Family::kR1, true),
        std::make_tuple("v2", "deepseek_v2.jinja", ChatTemplate::Family::kV2, false),
        std::make_tuple("chatml", "chatml_tools.jinja", ChatTemplate::Family::kOther, false)}) {
    absl::StatusOr<std::string> text = ReadFileToString(ChatGoldenPath(file));
    ASSERT_TRUE(text.ok()) << text.status();
    absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromText(*text, kBos, kEos);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->family(), expected_family);
    EXPECT_EQ((*t)->supports_tools(), tools);
    int rendered = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      const nlohmann::json& c = cases[i];
      SCOPED_TRACE(absl::StrCat(family, " ", c["name"].get<std::string>()));
      std::vector<ChatMessage> messages;
      bool tool_turns = false;
      for (const nlohmann::json& m : c.at("messages")) {
        messages.push_back(FromJson(m));
        tool_turns = tool_turns || messages.back().role == "tool" || messages.back().has_tool_calls;
      }
      // The request's tools, as the HTTP API hands them over.
      ChatRenderOptions options;
      if (ordered[i].contains("tools")) {
        for (const nlohmann::ordered_json& tool : ordered[i]["tools"]) {
          options.tool_schemas.push_back(PythonJsonDumps(tool.at("function")));
        }
      }
      absl::StatusOr<std::string> s = c.at("add_generation_prompt").get<bool>()
                                          ? (*t)->RenderForGeneration(messages, options)
                                          : (*t)->Render(messages, false);
      const nlohmann::json& want = c.at(family);
      if (want.is_object() || (tool_turns && expected_family == ChatTemplate::Family::kV2)) {
        // jinja2 raised (V2's template on an assistant's None content), or
        // the template has no tool branches: refused by name either way.
        EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << s.status();
        continue;
      }
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_EQ(*s, want.get<std::string>());
      ++rendered;
    }
    EXPECT_GE(rendered, 5);
  }
}

TEST(ChatTemplateTest, ToolMessagesNeedToolBranchesAndContent) {
  absl::StatusOr<std::string> text = ReadFileToString(ChatGoldenPath("deepseek_r1.jinja"));
  ASSERT_TRUE(text.ok()) << text.status();
  auto r1 = ChatTemplate::FromText(*text, kBos, kEos);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ChatMessage no_content{"assistant", ""};
  no_content.content_null = true;
  EXPECT_EQ((*r1)->Render({{"user", "q"}, no_content}, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  ChatMessage null_tool{"tool", ""};
  null_tool.content_null = true;
  EXPECT_EQ((*r1)->Render({{"user", "q"}, null_tool}, true).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A template without tool branches: calls are refused, not dropped.
  auto plain = ChatTemplate::FromText(kV3WithoutTools, kBos, kEos);
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE((*plain)->supports_tools());
  ChatMessage calls{"assistant", ""};
  calls.content_null = true;
  calls.has_tool_calls = true;
  calls.tool_calls.push_back({"c", "function", "f", "{}"});
  EXPECT_EQ((*plain)->Render({{"user", "q"}, calls}, true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A request's chat_template_kwargs are the template's variables, as
// apply_chat_template's keyword arguments (DeepSeek-V3.1's template opens the
// reply with <think> or </think> by `thinking`); they may override the
// tokenizer's tokens.
TEST(ChatTemplateTest, TemplateKwargsAreVariables) {
  auto t = ChatTemplate::FromText(
      "{{ bos_token }}{% for m in messages %}<｜User｜>{{ m.content }}{% endfor %}"
      "<｜Assistant｜>{% if thinking is defined and thinking %}<think>{% else %}</think>{% endif %}"
      "{{ extra | default('') }}",
      kBos, kEos);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->family(), ChatTemplate::Family::kR1);
  ChatRenderOptions o;
  absl::StatusOr<std::string> s = (*t)->RenderForGeneration({{"user", "q"}}, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, std::string(kBos) + "<｜User｜>q<｜Assistant｜></think>");
  o.template_kwargs = R"({"thinking": true, "extra": [1, "x"], "bos_token": "<B>"})";
  s = (*t)->RenderForGeneration({{"user", "q"}}, o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, "<B><｜User｜>q<｜Assistant｜><think>[1, 'x']");
  o.template_kwargs = "[1]";
  EXPECT_EQ((*t)->RenderForGeneration({{"user", "q"}}, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// mkmodel writes DeepSeek-V3's template as the release ships it: the same
// text as the golden file, tool branches included.
TEST(ChatTemplateTest, MkmodelsTemplateIsTheReleasesWithTools) {
  absl::StatusOr<std::string> text = ReadFileToString(ChatGoldenPath("deepseek_v3.jinja"));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(std::string(kDeepSeekV3ChatTemplate), *text);
  auto t = ChatTemplate::FromText(kDeepSeekV3ChatTemplate, kBos, kEos);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE((*t)->supports_tools());
}

TEST(ChatTemplateTest, LoadsWhatMkmodelWrites) {
  const std::string dir = JoinPath(::testing::TempDir(), "chat_template_test");
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(MakeDirs(dir).ok());
  absl::StatusOr<std::unique_ptr<ChatTemplate>> none = ChatTemplate::Load(dir);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);
  ASSERT_TRUE(
      WriteStringToFile(JoinPath(dir, "tokenizer_config.json"), DeepSeekTokenizerConfigJson())
          .ok());
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::Load(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE(*t, nullptr);
  EXPECT_EQ(*(*t)->Render({{"user", "Hi"}}, true), Cases()[0].v3);
  // Newer checkpoints: the template in chat_template.jinja, tokens as objects.
  nlohmann::json config = {{"bos_token", {{"content", kBos}}}, {"eos_token", kEos}};
  ASSERT_TRUE(WriteStringToFile(JoinPath(dir, "tokenizer_config.json"), config.dump()).ok());
  ASSERT_TRUE(WriteStringToFile(JoinPath(dir, "chat_template.jinja"), kV2Template).ok());
  t = ChatTemplate::Load(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*(*t)->Render({{"user", "Hi"}}, true), Cases()[0].v2);
  ASSERT_TRUE(WriteStringToFile(JoinPath(dir, "tokenizer_config.json"), "{oops").ok());
  EXPECT_EQ(ChatTemplate::Load(dir).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace moesh
