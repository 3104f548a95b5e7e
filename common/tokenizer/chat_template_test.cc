#include "common/tokenizer/chat_template.h"

#include <filesystem>
#include <tuple>

#include "base/file_util.h"
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
  const std::string r1 = std::string(kDeepSeekV3ChatTemplate) +
                         "{% if '</think>' in content %}{% endif %}"
                         "{{'<｜Assistant｜><think>\\n'}}";
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromText(r1, kBos, kEos);
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
  EXPECT_EQ(ChatTemplate::FromText("{{ messages }}", kBos, kEos).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto t = ChatTemplate::FromText(kV3WithoutTools, kBos, kEos);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*t)->Render({}, true).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status tool = (*t)->Render({{"tool", "42"}}, true).status();
  EXPECT_EQ(tool.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tool.message().find("'tool'"), std::string::npos) << tool;
}

// tests/golden/chat_template/: the shipped V3 and R1 templates and jinja2's
// renderings of them (make_chat_goldens.py).
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
  ASSERT_GE(cases.size(), 9u);
  for (const auto& [family, file, expected_family] :
       {std::make_tuple("v3", "deepseek_v3.jinja", ChatTemplate::Family::kV3),
        std::make_tuple("r1", "deepseek_r1.jinja", ChatTemplate::Family::kR1)}) {
    absl::StatusOr<std::string> text = ReadFileToString(ChatGoldenPath(file));
    ASSERT_TRUE(text.ok()) << text.status();
    absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromText(*text, kBos, kEos);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ((*t)->family(), expected_family);
    EXPECT_TRUE((*t)->supports_tools());
    for (const nlohmann::json& c : cases) {
      std::vector<ChatMessage> messages;
      for (const nlohmann::json& m : c.at("messages")) messages.push_back(FromJson(m));
      absl::StatusOr<std::string> s = (*t)->Render(messages, c.at("add_generation_prompt"));
      ASSERT_TRUE(s.ok()) << family << " " << c["name"] << ": " << s.status();
      EXPECT_EQ(*s, c.at(family).get<std::string>()) << family << " " << c["name"];
    }
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

// R1-Distill's templates set the system prompt per system message (no
// is_first_sp): the last one alone is rendered.
TEST(ChatTemplateTest, LastSystemWinsWithoutIsFirstSp) {
  auto t = ChatTemplate::FromText(
      "{% set ns.system_prompt = message['content'] %}{{'<｜User｜>'}}{{'<｜Assistant｜>'}}", kBos,
      kEos);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<std::string> s = (*t)->Render({{"system", "A"}, {"user", "u"}, {"system", "B"}},
                                               /*add_generation_prompt=*/false);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, std::string(kBos) + "B<｜User｜>u");
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
