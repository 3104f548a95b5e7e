#include "router/openai_api.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "router/api_keys.h"
#include "router/openai_test_util.h"

#ifndef MOESH_REPO_DIR
#define MOESH_REPO_DIR "."
#endif

namespace moesh {
namespace {

using Json = nlohmann::json;
using openai_testing::Events;
using openai_testing::Final;
using openai_testing::Parse;
using openai_testing::Tokens;

// One function definition, as clients send it.
Json Tools() {
  return Json::array(
      {{{"type", "function"},
        {"function",
         {{"name", "get_weather"},
          {"description", "Weather of a city"},
          {"parameters",
           {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});
}

// The error JSON's fields and the HTTP status, for `status`.
Json ErrorOf(const absl::Status& status, int* http) {
  HttpError e = ToHttpError(status);
  *http = e.http_status;
  return Json::parse(e.body)["error"];
}

TEST(OpenAiApiTest, MapsCompletionFields) {
  absl::StatusOr<OpenAiRequest> r = Parse({{"model", "m"},
                                           {"prompt", "Hello"},
                                           {"max_tokens", 7},
                                           {"temperature", 0.5},
                                           {"top_p", 0.9},
                                           {"top_k", 40},
                                           {"min_p", 0.1},
                                           {"presence_penalty", 0.5},
                                           {"frequency_penalty", -0.5},
                                           {"repetition_penalty", 1.1},
                                           {"seed", 42},
                                           {"stop", {"\n", "END"}},
                                           {"logprobs", 3},
                                           {"stream", true},
                                           {"stream_options", {{"include_usage", true}}},
                                           {"user", "ignored"},
                                           {"some_future_field", {1, 2}}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "m");
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(r->logprobs);
  EXPECT_EQ(r->top_logprobs, 3);
  const v1::GenerateRequest& g = r->generate;
  EXPECT_EQ(g.text(), "Hello");
  EXPECT_TRUE(g.detokenize());
  EXPECT_EQ(g.stop().max_new_tokens(), 7);
  EXPECT_FLOAT_EQ(g.sampling().temperature(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().top_p(), 0.9f);
  EXPECT_EQ(g.sampling().top_k(), 40);
  EXPECT_FLOAT_EQ(g.sampling().min_p(), 0.1f);
  EXPECT_FLOAT_EQ(g.sampling().presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(g.sampling().frequency_penalty(), -0.5f);
  EXPECT_FLOAT_EQ(g.sampling().repetition_penalty(), 1.1f);
  EXPECT_EQ(g.sampling().seed(), 42u);
  EXPECT_EQ(g.sampling().top_logprobs(), 3);
  ASSERT_EQ(g.stop().stop_strings_size(), 2);
  EXPECT_EQ(g.stop().stop_strings(1), "END");
  EXPECT_FALSE(g.sampling().has_temperature() && !r.ok());
}

TEST(OpenAiApiTest, LeavesUnsetFieldsToTheServer) {
  absl::StatusOr<OpenAiRequest> r = Parse({{"prompt", {{1, 2, 3}}}, {"max_tokens", nullptr}});
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->generate.token_ids().ids_size(), 3);
  EXPECT_FALSE(r->generate.stop().has_max_new_tokens());
  EXPECT_FALSE(r->generate.sampling().has_temperature());
  EXPECT_FALSE(r->generate.sampling().has_seed());
  EXPECT_FALSE(r->logprobs);
  EXPECT_FALSE(r->generate.sampling().has_top_logprobs());
}

TEST(OpenAiApiTest, ChatMessagesAndLogprobs) {
  absl::StatusOr<OpenAiRequest> r = Parse(
      {{"messages",
        {{{"role", "developer"}, {"content", "Be brief."}},
         {{"role", "user"},
          {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}}}},
       {"max_completion_tokens", 5},
       {"logprobs", true},
       {"top_logprobs", 2}},
      /*chat=*/true);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->messages.size(), 2u);
  EXPECT_EQ(r->messages[0].role, "system");
  EXPECT_EQ(r->messages[1].content, "ab");
  EXPECT_EQ(r->generate.stop().max_new_tokens(), 5);
  EXPECT_EQ(r->top_logprobs, 2);
  EXPECT_EQ(r->generate.sampling().top_logprobs(), 2);
  EXPECT_TRUE(r->generate.sampling().logprobs());
  // logprobs without alternatives asks for the sampled token's own only.
  r = Parse({{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"logprobs", true}}, true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->top_logprobs, 0);
  EXPECT_EQ(r->generate.sampling().top_logprobs(), 0);
  EXPECT_TRUE(r->generate.sampling().logprobs());
  EXPECT_FALSE(r->generate.sampling().has_prompt_logprobs());
  EXPECT_EQ(r->generate.n(), 1);
}

TEST(OpenAiApiTest, MapsNAndEcho) {
  absl::StatusOr<OpenAiRequest> r =
      Parse({{"prompt", "x"}, {"n", 3}, {"echo", true}, {"logprobs", 2}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->n, 3);
  EXPECT_EQ(r->generate.n(), 3);
  EXPECT_TRUE(r->echo);
  // echo with logprobs asks the prefill pass for the prompt's.
  EXPECT_EQ(r->generate.sampling().prompt_logprobs(), 2);
  r = Parse({{"prompt", "x"}, {"echo", true}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->generate.sampling().has_prompt_logprobs());
  // Beyond the limit: refused naming n.
  r = Parse({{"prompt", "x"}, {"n", 17}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(ErrorParam(r.status()), "n");
  r = Parse({{"prompt", "x"}, {"n", 0}});
  EXPECT_FALSE(r.ok());
}

TEST(OpenAiApiTest, RefusesWhatItCannotHonour) {
  struct Bad {
    Json body;
    bool chat;
    std::string param;
  };
  const Json msgs = {{{"role", "user"}, {"content", "x"}}};
  const std::vector<Bad> bad = {
      {{{"prompt", "x"}, {"best_of", 3}}, false, "best_of"},
      {{{"prompt", "x"}, {"logit_bias", {{"5", 1}}}}, false, "logit_bias"},
      {{{"messages", msgs}, {"tools", {{{"type", "function"}}}}}, true, "tools[0].function"},
      {{{"messages", msgs}, {"tools", "f"}}, true, "tools"},
      {{{"messages", msgs}, {"tools", {{{"type", "code"}}}}}, true, "tools[0].type"},
      {{{"messages", msgs},
        {"tools", {{{"type", "function"}, {"function", {{"name", "bad name!"}}}}}}},
       true,
       "tools[0].function.name"},
      {{{"messages", msgs},
        {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", 3}}}}}}},
       true,
       "tools[0].function.parameters"},
      {{{"messages", msgs}, {"tool_choice", "auto"}}, true, "tool_choice"},
      {{{"messages", msgs}, {"tools", Tools()}, {"tool_choice", "sometimes"}}, true, "tool_choice"},
      {{{"messages", msgs}, {"tools", Tools()}, {"tool_choice", 3}}, true, "tool_choice"},
      {{{"messages", msgs},
        {"tools", Tools()},
        {"tool_choice", {{"type", "function"}, {"function", {{"name", "other"}}}}}},
       true,
       "tool_choice.function.name"},
      {{{"messages", msgs}, {"tools", Tools()}, {"tool_choice", {{"type", "function"}}}},
       true,
       "tool_choice.function.name"},
      {{{"prompt", "x"}, {"tools", Tools()}}, false, "tools"},
      {{{"messages", msgs}, {"separate_reasoning", "no"}}, true, "separate_reasoning"},
      {{{"messages", {{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", 5}}}}},
       true,
       "messages[0].tool_calls"},
      {{{"messages", msgs}, {"response_format", {{"type", "json_object"}}}},
       true,
       "response_format"},
      {{{"prompt", "x"}, {"temperature", "hot"}}, false, "temperature"},
      {{{"prompt", "x"}, {"temperature", 3}}, false, "temperature"},
      {{{"prompt", "x"}, {"max_tokens", 0}}, false, "max_tokens"},
      {{{"prompt", "x"}, {"max_tokens", 1.5}}, false, "max_tokens"},
      {{{"prompt", "x"}, {"stream", "yes"}}, false, "stream"},
      {{{"prompt", "x"}, {"stop", {1}}}, false, "stop"},
      {{{"prompt", {"a", "b"}}}, false, "prompt"},
      {{{"prompt", 5}}, false, "prompt"},
      {Json::object(), false, "prompt"},
      {{{"messages", Json::array()}}, true, "messages"},
      {{{"messages", {{{"content", "x"}}}}}, true, "messages[0].role"},
      {{{"messages", msgs}, {"top_logprobs", 2}}, true, "top_logprobs"},
      {{{"messages", msgs}, {"logprobs", true}, {"top_logprobs", 21}}, true, "top_logprobs"},
      {{{"messages",
         {{{"role", "assistant"},
           {"content", nullptr},
           {"tool_calls", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}}}},
       true,
       "messages[0].tool_calls[0].function.arguments"},
  };
  for (const Bad& b : bad) {
    absl::StatusOr<OpenAiRequest> r = Parse(b.body, b.chat);
    ASSERT_FALSE(r.ok()) << b.body;
    int http = 0;
    Json e = ErrorOf(r.status(), &http);
    EXPECT_EQ(http, 400) << b.body;
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_EQ(e["param"], b.param) << b.body << ": " << r.status();
  }
  for (const char* text : {"{", "[1,2]", "", "{\"prompt\": \"x\",}"}) {
    absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(text, false);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
}

TEST(OpenAiApiTest, ErrorsCarryOpenAiShapeAndStatus) {
  const std::vector<std::pair<absl::Status, int>> cases = {
      {absl::InvalidArgumentError("bad"), 400},
      {ModelNotFoundError("x"), 404},
      {BodyTooLargeError(10), 413},
      {absl::UnauthenticatedError("no key"), 401},
      {absl::ResourceExhaustedError("full"), 429},
      {absl::UnavailableError("draining"), 503},
      {absl::InternalError("bug"), 500},
  };
  for (const auto& [status, want] : cases) {
    int http = 0;
    Json e = ErrorOf(status, &http);
    EXPECT_EQ(http, want) << status;
    EXPECT_EQ(e["message"], std::string(status.message()));
    EXPECT_TRUE(e.contains("type") && e.contains("param") && e.contains("code"));
  }
  int http = 0;
  EXPECT_EQ(ErrorOf(ModelNotFoundError("x"), &http)["code"], "model_not_found");
}

std::unique_ptr<ChatTemplate> R1Template() {
  std::ifstream in(std::string(MOESH_REPO_DIR) + "/tests/golden/chat_template/deepseek_r1.jinja");
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t =
      ChatTemplate::FromText(text.str(), "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>");
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? std::move(*t) : nullptr;
}

v1::GenerateResponse Text(std::string text) {
  v1::GenerateResponse m;
  m.set_text(std::move(text));
  return m;
}

v1::GenerateResponse FinalStop() {
  v1::GenerateResponse m = Final();
  m.mutable_final()->set_finish_reason(v1::FINISH_REASON_STOP);
  return m;
}

TEST(OpenAiApiTest, RendersToolRoundTripInTheTemplatesFormat) {
  std::unique_ptr<ChatTemplate> r1 = R1Template();
  ASSERT_NE(r1, nullptr);
  absl::StatusOr<OpenAiRequest> r = Parse(
      {{"messages",
        {{{"role", "user"}, {"content", "Weather in Oslo?"}},
         {{"role", "assistant"},
          {"content", nullptr},
          {"tool_calls",
           {{{"id", "call_1"},
             {"type", "function"},
             {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Oslo\"}"}}}}}}},
         {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "cold"}},
         {{"role", "assistant"}, {"content", "It is cold."}},
         {{"role", "user"}, {"content", "Thanks"}}}},
       {"tools", Tools()}},
      true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->tool_choice, "auto");
  absl::StatusOr<std::string> prompt = RenderChatPrompt(*r1, &*r);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(
      *prompt,
      "<｜begin▁of▁sentence｜><｜User｜>Weather in Oslo?<｜Assistant｜><｜tool▁calls▁begin｜>"
      "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\":\"Oslo\"}\n```"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁outputs▁begin｜>"
      "<｜tool▁output▁begin｜>cold<｜tool▁output▁end｜><｜tool▁outputs▁end｜>It is cold."
      "<｜end▁of▁sentence｜><｜User｜>Thanks<｜Assistant｜><think>\n");
  EXPECT_TRUE(r->output.reasoning);
  EXPECT_TRUE(r->output.in_reasoning);
  EXPECT_TRUE(r->output.tools);
  EXPECT_EQ(r->forced_output, "");
  // A template without DeepSeek's tool format: calls asked of it are refused,
  // tool_choice "none" is fine.
  absl::StatusOr<std::unique_ptr<ChatTemplate>> plain = ChatTemplate::FromText(
      "{% for message in messages %}{{'<｜User｜>' + message['content']}}{% endfor %}"
      "{{'<｜Assistant｜>'}}",
      "<｜begin▁of▁sentence｜>", "");
  ASSERT_TRUE(plain.ok());
  const Json msgs = {{{"role", "user"}, {"content", "x"}}};
  r = Parse({{"messages", msgs}, {"tools", Tools()}}, true);
  ASSERT_TRUE(r.ok());
  absl::Status refused = RenderChatPrompt(**plain, &*r).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrorParam(refused), "tools");
  r = Parse({{"messages", msgs}, {"tools", Tools()}, {"tool_choice", "none"}}, true);
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(RenderChatPrompt(**plain, &*r).ok());
  EXPECT_FALSE(r->output.tools);
  EXPECT_FALSE(r->output.reasoning);
}

// chat_template_kwargs reach the template as variables; the request's own
// variables cannot be overridden through them.
TEST(OpenAiApiTest, ChatTemplateKwargsReachTheTemplate) {
  absl::StatusOr<std::unique_ptr<ChatTemplate>> t = ChatTemplate::FromText(
      "{% for m in messages %}{{ m.content }}{% endfor %}|{{ thinking }}|{{ style | default('-') "
      "}}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.status();
  const Json msgs = {{{"role", "user"}, {"content", "x"}}};
  absl::StatusOr<OpenAiRequest> r = Parse(
      {{"messages", msgs}, {"chat_template_kwargs", {{"thinking", true}, {"style", "terse"}}}},
      true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->thinking);
  absl::StatusOr<std::string> prompt = RenderChatPrompt(**t, &*r);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(*prompt, "x|True|terse");
  for (const char* reserved : {"messages", "add_generation_prompt", "tools"}) {
    absl::Status s =
        Parse({{"messages", msgs}, {"chat_template_kwargs", {{reserved, 1}}}}, true).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << reserved;
    EXPECT_EQ(ErrorParam(s), std::string("chat_template_kwargs.") + reserved);
  }
}

TEST(OpenAiApiTest, NamedToolChoiceOpensTheCall) {
  std::unique_ptr<ChatTemplate> r1 = R1Template();
  ASSERT_NE(r1, nullptr);
  const Json msgs = {{{"role", "user"}, {"content", "Oslo?"}}};
  absl::StatusOr<OpenAiRequest> r =
      Parse({{"messages", msgs},
             {"tools", Tools()},
             {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}},
            true);
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<std::string> prompt = RenderChatPrompt(*r1, &*r);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  const std::string opening =
      "<｜Assistant｜><think>\n</think>\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function"
      "<｜tool▁sep｜>get_weather\n```json\n";
  EXPECT_TRUE(absl::EndsWith(*prompt, opening)) << *prompt;
  // The model continues the call; the client sees a whole call.
  OpenAiResponder responder(*r, "chatcmpl-7", "tiny", 100, [](int32_t) { return ""; });
  responder.Add(Text("{\"city\": \"Oslo\"}\n```<｜tool▁call▁end｜>"));
  responder.Add(Text("<｜tool▁calls▁end｜>"));
  responder.Add(FinalStop());
  const Json body = Json::parse(responder.Body());
  const Json& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_EQ(choice["message"]["reasoning_content"], "");
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  const Json& call = choice["message"]["tool_calls"][0];
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["id"], "call_chatcmpl-7_0_0");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  EXPECT_EQ(Json::parse(call["function"]["arguments"].get<std::string>())["city"], "Oslo");
  // "required": the call is opened, the model names the function.
  r = Parse({{"messages", msgs}, {"tools", Tools()}, {"tool_choice", "required"}}, true);
  ASSERT_TRUE(r.ok());
  prompt = RenderChatPrompt(*r1, &*r);
  ASSERT_TRUE(prompt.ok());
  EXPECT_TRUE(absl::EndsWith(*prompt, "<｜tool▁call▁begin｜>function<｜tool▁sep｜>")) << *prompt;
}

// DeepSeek-V3.2's encoder: the thinking switch, the tool definitions in the
// client's key order, reasoning_content read, a named call opened in DSML and
// parsed back into tool_calls.
TEST(OpenAiApiTest, DsmlEncoderRequests) {
  std::unique_ptr<ChatTemplate> v32 = ChatTemplate::ForEncoder(ChatTemplate::Family::kV32);
  const std::string tool =
      R"({"type": "function", "function": {"name": "get_weather", "parameters": )"
      R"({"type": "object", "properties": {"city": {"type": "string"}}}, "description": "W"}})";
  absl::StatusOr<OpenAiRequest> r =
      ParseOpenAiRequest(R"({"messages": [{"role": "user", "content": "Oslo?"},)"
                         R"( {"role": "assistant", "content": "Hm.", "reasoning_content": "old"},)"
                         R"( {"role": "user", "content": "And Rome?"}], "tools": [)" +
                             tool + R"(], "chat_template_kwargs": {"thinking": true}})",
                         true);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->thinking);
  EXPECT_EQ(r->messages[1].reasoning_content, "old");
  ASSERT_EQ(r->tool_schemas.size(), 1u);
  EXPECT_EQ(r->tool_schemas[0],
            R"({"name": "get_weather", "parameters": {"type": "object", "properties": )"
            R"({"city": {"type": "string"}}}, "description": "W"})");
  absl::StatusOr<std::string> prompt = RenderChatPrompt(*v32, &*r);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_NE(prompt->find("<functions>\n" + r->tool_schemas[0] + "\n</functions>"),
            std::string::npos)
      << *prompt;
  // The earlier turn's reasoning is dropped; the last user turn opens <think>.
  EXPECT_EQ(prompt->find("old"), std::string::npos) << *prompt;
  EXPECT_TRUE(absl::EndsWith(*prompt, "<｜User｜>And Rome?<｜Assistant｜><think>")) << *prompt;
  EXPECT_TRUE(r->output.reasoning && r->output.in_reasoning && r->output.tools);
  EXPECT_EQ(r->output.tool_format, ChatOutputParser::ToolFormat::kDsml);
  EXPECT_EQ(r->output.dsml_block, "function_calls");
  // Thinking off (the default): no reasoning; tool_choice "none" leaves the
  // definitions out.
  r = ParseOpenAiRequest(R"({"messages": [{"role": "user", "content": "Oslo?"}], "tools": [)" +
                             tool + R"(], "tool_choice": "none"})",
                         true);
  ASSERT_TRUE(r.ok()) << r.status();
  prompt = RenderChatPrompt(*v32, &*r);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(*prompt, "<｜begin▁of▁sentence｜><｜User｜>Oslo?<｜Assistant｜></think>");
  EXPECT_FALSE(r->output.reasoning || r->output.in_reasoning || r->output.tools);
  // A named function: the prompt opens its invoke; the model's parameters
  // come back as tool_calls.
  r = ParseOpenAiRequest(
      R"({"messages": [{"role": "user", "content": "Oslo?"}], "tools": [)" + tool +
          R"(], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},)"
          R"( "chat_template_kwargs": {"thinking": true}})",
      true);
  ASSERT_TRUE(r.ok()) << r.status();
  prompt = RenderChatPrompt(*v32, &*r);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_TRUE(absl::EndsWith(*prompt,
                             "<｜Assistant｜><think></think>\n\n<｜DSML｜function_calls>\n"
                             "<｜DSML｜invoke name=\"get_weather\">\n"))
      << *prompt;
  OpenAiResponder responder(*r, "chatcmpl-9", "tiny", 100, [](int32_t) { return ""; });
  responder.Add(
      Text("<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>\n"));
  responder.Add(Text("</｜DSML｜invoke>\n</｜DSML｜function_calls>"));
  responder.Add(FinalStop());
  const Json body = Json::parse(responder.Body());
  const Json& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], R"({"city": "Oslo"})");
  // The switch's type is checked; reasoning_effort too.
  for (const char* bad : {R"({"messages": [{"role": "user", "content": "x"}],)"
                          R"( "chat_template_kwargs": {"thinking": 1}})",
                          R"({"messages": [{"role": "user", "content": "x"}],)"
                          R"( "reasoning_effort": 3})"}) {
    absl::Status s = ParseOpenAiRequest(bad, true).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

// Deltas of a streamed chat, summed: reasoning, content, tool calls, finish.
struct StreamedChat {
  std::string reasoning, content, finish;
  Json calls = Json::array();
  bool done = false;
  void Add(const std::string& sse) {
    for (const Json& e : Events(sse, &done)) {
      if (e["choices"].empty()) continue;
      const Json& c = e["choices"][0];
      if (c["finish_reason"].is_string()) finish = c["finish_reason"];
      const Json& d = c["delta"];
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content")) content += d["content"].get<std::string>();
      if (d.contains("tool_calls")) {
        for (const Json& t : d["tool_calls"]) calls.push_back(t);
      }
    }
  }
};

TEST(OpenAiApiTest, StreamsReasoningAndToolCallDeltas) {
  std::unique_ptr<ChatTemplate> r1 = R1Template();
  ASSERT_NE(r1, nullptr);
  const std::vector<std::string> pieces = {
      "Let me th", "ink</th", "ink>Calling.<｜tool▁ca",
      "lls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{}\n```",
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"};
  for (bool separate : {true, false}) {
    absl::StatusOr<OpenAiRequest> r = Parse({{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                             {"tools", Tools()},
                                             {"stream", true},
                                             {"separate_reasoning", separate}},
                                            true);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(RenderChatPrompt(*r1, &*r).ok());
    OpenAiResponder responder(*r, "chatcmpl-2", "tiny", 100, [](int32_t) { return ""; });
    StreamedChat s;
    for (const std::string& p : pieces) s.Add(responder.StreamEvents(Text(p)));
    s.Add(responder.StreamEvents(FinalStop()));
    EXPECT_TRUE(s.done);
    EXPECT_EQ(s.finish, "tool_calls");
    ASSERT_EQ(s.calls.size(), 1u);
    EXPECT_EQ(s.calls[0]["index"], 0);
    EXPECT_EQ(s.calls[0]["type"], "function");
    EXPECT_FALSE(s.calls[0]["id"].get<std::string>().empty());
    EXPECT_EQ(s.calls[0]["function"]["name"], "get_weather");
    EXPECT_EQ(s.calls[0]["function"]["arguments"], "{}");
    if (separate) {
      EXPECT_EQ(s.reasoning, "Let me think");
      EXPECT_EQ(s.content, "Calling.");
    } else {  // the thinking stays in the content, as the model wrote it
      EXPECT_EQ(s.reasoning, "");
      EXPECT_EQ(s.content, "Let me think</think>Calling.");
    }
  }
}

// V3/R1 calls stream in pieces: the header's delta (index, id, type, name,
// empty arguments), then the arguments as they come; joined, the streamed
// call is the non-streamed one.
TEST(OpenAiApiTest, StreamsV3CallsInPieces) {
  std::unique_ptr<ChatTemplate> r1 = R1Template();
  ASSERT_NE(r1, nullptr);
  const std::vector<std::string> pieces = {
      "</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n",
      "```json\n{\"city\": \"Z\xC3",
      "\xBCrich\", \"days\"",
      ": 2}\n``",
      "`<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n",
      "{\"city\": \"Oslo\"}",
      "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"};
  absl::StatusOr<OpenAiRequest> r = Parse(
      {{"messages", {{{"role", "user"}, {"content", "x"}}}}, {"tools", Tools()}, {"stream", true}},
      true);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(RenderChatPrompt(*r1, &*r).ok());
  OpenAiResponder streamed(*r, "chatcmpl-4", "tiny", 100, [](int32_t) { return ""; });
  OpenAiResponder whole(*r, "chatcmpl-4", "tiny", 100, [](int32_t) { return ""; });
  StreamedChat s;
  for (const std::string& p : pieces) {
    s.Add(streamed.StreamEvents(Text(p)));
    whole.Add(Text(p));
  }
  s.Add(streamed.StreamEvents(FinalStop()));
  whole.Add(FinalStop());
  EXPECT_EQ(s.finish, "tool_calls");
  EXPECT_EQ(s.content, "");
  // The first call's header, then three pieces of its arguments (the
  // fence's and the end marker's messages add none), the second call's
  // header, its arguments.
  ASSERT_EQ(s.calls.size(), 6u) << s.calls.dump();
  EXPECT_EQ(s.calls[0], Json::parse(R"({"index": 0, "id": "call_chatcmpl-4_0_0", "type":
      "function", "function": {"name": "get_weather", "arguments": ""}})"));
  EXPECT_EQ(s.calls[1],
            Json::parse(R"({"index": 0, "function": {"arguments": "{\"city\": \"Z"}})"));
  EXPECT_EQ(s.calls[4]["id"], "call_chatcmpl-4_0_1");
  const Json body = Json::parse(whole.Body());
  const Json& calls = body["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    std::string arguments;
    for (const Json& c : s.calls) {
      if (c["index"] == i) arguments += c["function"]["arguments"].get<std::string>();
    }
    EXPECT_EQ(arguments, calls[i]["function"]["arguments"]) << i;
  }
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\": \"Zürich\", \"days\": 2}");
  EXPECT_EQ(calls[1]["function"]["arguments"], "{\"city\": \"Oslo\"}");
}

// DSML calls stream in pieces: the forced opening's call (id, name) in the
// first chunk, then its arguments, joined by index as the SDKs do.
TEST(OpenAiApiTest, StreamsDsmlCallsInPieces) {
  std::unique_ptr<ChatTemplate> v4 = ChatTemplate::ForEncoder(ChatTemplate::Family::kV4);
  absl::StatusOr<OpenAiRequest> r =
      Parse({{"messages", {{{"role", "user"}, {"content", "x"}}}},
             {"tools", Tools()},
             {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}},
             {"stream", true}},
            true);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(RenderChatPrompt(*v4, &*r).ok());
  EXPECT_EQ(r->output.dsml_block, "tool_calls");
  OpenAiResponder responder(*r, "chatcmpl-3", "tiny", 100, [](int32_t) { return ""; });
  StreamedChat s;
  for (const char* p : {"<｜DSML｜parameter name=\"city\" string=\"true\">Oslo</｜DSML｜parameter>",
                        "\n<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>",
                        "\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>"}) {
    s.Add(responder.StreamEvents(Text(p)));
  }
  s.Add(responder.StreamEvents(FinalStop()));
  EXPECT_EQ(s.finish, "tool_calls");
  EXPECT_EQ(s.content, "");
  ASSERT_EQ(s.calls.size(), 3u);  // one piece per message
  EXPECT_EQ(s.calls[0]["id"], "call_chatcmpl-3_0_0");
  EXPECT_EQ(s.calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(s.calls[0]["function"]["arguments"], R"({"city": "Oslo")");
  std::string arguments;
  for (const Json& c : s.calls) {
    EXPECT_EQ(c["index"], 0);
    arguments += c["function"]["arguments"].get<std::string>();
  }
  EXPECT_FALSE(s.calls[1].contains("id"));
  EXPECT_EQ(arguments, R"({"city": "Oslo", "days": 2})");
}

TEST(ApiKeysTest, ChecksBearerKeys) {
  ApiKeys keys({"k1", "secret-2"});
  EXPECT_TRUE(keys.Check("Bearer k1").ok());
  EXPECT_TRUE(keys.Check("bearer secret-2").ok());
  for (const char* bad : {"", "k1", "Bearer", "Bearer k2", "Bearer k1x", "Basic k1"}) {
    EXPECT_EQ(keys.Check(bad).code(), absl::StatusCode::kUnauthenticated) << bad;
  }
}

TEST(ApiKeysTest, LoopbackListenersNeedNoWarning) {
  for (const char* loopback :
       {"127.0.0.1:0", "127.8.9.1:80", "localhost:50051", "[::1]:8000", "127.0.0.1:1,[::1]:1"}) {
    EXPECT_TRUE(IsLoopbackListen(loopback)) << loopback;
  }
  for (const char* open : {"0.0.0.0:50051", "[::]:80", ":80", "8000", "10.0.0.3:80", "host:1",
                           "128.0.0.1:1", "127.0.0.1:1,8080", "", "[::ffff:0.0.0.0]:1"}) {
    EXPECT_FALSE(IsLoopbackListen(open)) << open;
  }
  EXPECT_EQ(MissingApiKeysWarning(nullptr, {{"--listen", "127.0.0.1:0"}, {"--http_listen", ""}}),
            "");
  const ApiKeys keys({"k"});
  EXPECT_EQ(MissingApiKeysWarning(&keys, {{"--listen", "0.0.0.0:1"}}), "");
  const std::string warning = MissingApiKeysWarning(
      nullptr, {{"--listen", "0.0.0.0:50051"}, {"--http_listen", "127.0.0.1:8000"}});
  EXPECT_NE(warning.find("--listen 0.0.0.0:50051 binds beyond the loopback"), std::string::npos)
      << warning;
  EXPECT_EQ(warning.find("--http_listen"), std::string::npos) << warning;
}

}  // namespace
}  // namespace moesh
