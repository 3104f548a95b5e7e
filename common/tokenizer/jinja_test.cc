// The Jinja engine against jinja2: every case of tests/golden/jinja/
// goldens.json (made by make_jinja_goldens.py with jinja2 in transformers'
// chat-template environment) renders to jinja2's text, or fails where jinja2
// raised; and a hostile template is bounded, not a crash.
#include "common/tokenizer/jinja.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

#ifndef MOESH_REPO_DIR
#define MOESH_REPO_DIR "."
#endif

namespace moesh {
namespace jinja {
namespace {

// transformers' raise_exception: the template's message as the error.
Value RaiseException() {
  return Value::Callable("raise_exception", [](CallArgs& a) -> absl::StatusOr<Value> {
    return absl::InvalidArgumentError(a.positional.empty() ? "" : a.positional[0].Str());
  });
}

absl::StatusOr<std::string> Render(const std::string& source, const nlohmann::ordered_json& context,
                                   const RenderLimits& limits = {}) {
  absl::StatusOr<std::unique_ptr<Template>> t = Template::Parse(source);
  if (!t.ok()) return t.status();
  ValueDict vars;
  for (const auto& [k, v] : context.items()) vars.emplace_back(k, Value::FromJson(v));
  vars.emplace_back("raise_exception", RaiseException());
  return (*t)->Render(vars, limits);
}

TEST(JinjaTest, RendersWhatJinja2Renders) {
  absl::StatusOr<std::string> text =
      ReadFileToString(std::string(MOESH_REPO_DIR) + "/tests/golden/jinja/goldens.json");
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::ordered_json cases = nlohmann::ordered_json::parse(*text);
  ASSERT_GE(cases.size(), 40u);
  int errors = 0;
  for (const auto& c : cases) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    absl::StatusOr<std::string> got = Render(c["template"].get<std::string>(), c["context"]);
    if (c.contains("error")) {
      ++errors;
      ASSERT_FALSE(got.ok()) << "jinja2 raised " << c["error"] << ", the engine rendered " << *got;
      EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << got.status();
      if (c["error"] == "TemplateError") {  // raise_exception: the template's own words
        EXPECT_NE(got.status().message().find(c["message"].get<std::string>()), std::string::npos)
            << got.status();
      }
      continue;
    }
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(*got, c["output"].get<std::string>());
  }
  EXPECT_GE(errors, 8);
}

TEST(JinjaTest, ErrorsNameTheLine) {
  absl::StatusOr<std::string> r = Render("line one\n{{ 'a' }}\n{{ 'a' + 1 }}", {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("line 3"), std::string::npos) << r.status();
  r = Render("\n\n{% if %}", {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("line 3"), std::string::npos) << r.status();
  r = Render("{{ 'unterminated }}", {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  r = Render("{% for x in y %}", {});
  EXPECT_NE(r.status().message().find("endfor"), std::string::npos) << r.status();
}

TEST(JinjaTest, HostileTemplatesAreBounded) {
  // Work: a loop nest of 10^10 steps stops at the step bound (the default's
  // 2·10^6 too; a smaller one keeps the sanitizer build quick).
  RenderLimits steps;
  steps.max_steps = 100'000;
  absl::StatusOr<std::string> r =
      Render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", {},
             steps);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  // Output: doubling a string past the output bound.
  RenderLimits small;
  small.max_output_bytes = 1 << 20;
  r = Render("{% for i in range(100) %}{{ 'x' * 100000 }}{% endfor %}", {}, small);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  // Recursion: a macro calling itself.
  r = Render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  // Nesting: deep parentheses and blocks are a syntax error, not a stack overflow.
  r = Render(absl::StrCat("{{ ", std::string(5000, '('), "1", std::string(5000, ')'), " }}"), {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  std::string blocks;
  for (int i = 0; i < 5000; ++i) blocks += "{% if true %}";
  r = Render(blocks, {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  // A huge range is refused as jinja2's sandbox refuses it.
  r = Render("{{ range(1000000)|length }}", {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
}

TEST(JinjaTest, NamespaceIsTheOneMutableObject) {
  absl::StatusOr<std::string> r = Render(
      "{% set ns = namespace(n=0) %}{% macro bump() %}{% set ns.n = ns.n + 1 %}{% endmacro %}"
      "{{ bump() }}{{ bump() }}{{ ns.n }}{% set d = {'a': 1} %}{{ d.update({'a': 2}) }}",
      {});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  r = Render(
      "{% set ns = namespace(n=0) %}{% macro bump() %}{% set ns.n = ns.n + 1 %}{% endmacro %}"
      "{{ bump() }}{{ bump() }}{{ ns.n }}",
      {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "2");
}

TEST(JinjaTest, ParsedOnceRendersManyContexts) {
  absl::StatusOr<std::unique_ptr<Template>> t =
      Template::Parse("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}");
  ASSERT_TRUE(t.ok()) << t.status();
  for (int i = 0; i < 3; ++i) {
    ValueDict vars = {{"messages", Value::List({Value::Dict({{"role", Value::String("user")},
                                                             {"content", Value::Int(i)}})})}};
    absl::StatusOr<std::string> r = (*t)->Render(vars);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, absl::StrCat("user:", i, ";"));
  }
}

}  // namespace
}  // namespace jinja
}  // namespace moesh
