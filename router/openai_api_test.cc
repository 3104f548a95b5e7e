#include "router/openai_api.h"

#include "gtest/gtest.h"
#include "router/api_keys.h"

namespace moesh {
namespace {

using Json = nlohmann::json;

absl::StatusOr<OpenAiRequest> Parse(const Json& j, bool chat = false) {
  return ParseOpenAiRequest(j.dump(), chat);
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
      {{{"messages", msgs}, {"tools", {{{"type", "function"}}}}}, true, "tools"},
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
         {{{"role", "assistant"}, {"content", nullptr}, {"tool_calls", Json::array()}}}}},
       true,
       "messages[0].tool_calls"},
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

v1::GenerateResponse Tokens(std::vector<int32_t> ids, std::string text) {
  v1::GenerateResponse m;
  for (int32_t id : ids) {
    m.add_token_ids(id);
    m.add_token_logprobs(-0.5f);  // its own (here unlike its candidate's entry)
    v1::TopLogprobs* top = m.add_logprobs();
    v1::TokenLogprob* best = top->add_candidates();
    best->set_id(id);
    best->set_logprob(-0.25f);
    v1::TokenLogprob* other = top->add_candidates();
    other->set_id(id + 1);
    other->set_logprob(-2.0f);
  }
  m.set_text(std::move(text));
  return m;
}

v1::GenerateResponse Final() {
  v1::GenerateResponse m;
  m.mutable_final()->set_finish_reason(v1::FINISH_REASON_LENGTH);
  m.mutable_final()->mutable_usage()->set_prompt_tokens(4);
  m.mutable_final()->mutable_usage()->set_completion_tokens(2);
  return m;
}

std::vector<Json> Events(const std::string& sse, bool* done) {
  std::vector<Json> out;
  *done = false;
  size_t at = 0;
  while (at < sse.size()) {
    const size_t end = sse.find("\n\n", at);
    EXPECT_NE(end, std::string::npos);
    const std::string line = sse.substr(at, end - at);
    EXPECT_EQ(line.rfind("data: ", 0), 0u) << line;
    if (line == "data: [DONE]") {
      *done = true;
    } else {
      out.push_back(Json::parse(line.substr(6)));
    }
    at = end + 2;
  }
  return out;
}

TEST(OpenAiApiTest, StreamsChatChunksWithUsage) {
  absl::StatusOr<OpenAiRequest> r = Parse({{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                           {"stream", true},
                                           {"stream_options", {{"include_usage", true}}},
                                           {"logprobs", true},
                                           {"top_logprobs", 1}},
                                          true);
  ASSERT_TRUE(r.ok());
  OpenAiResponder responder(*r, "chatcmpl-1", "tiny", 100,
                            [](int32_t id) { return "t" + std::to_string(id); });
  bool done = false;
  std::vector<Json> first = Events(responder.StreamEvents(Tokens({5}, "Hel")), &done);
  ASSERT_EQ(first.size(), 2u);  // the role, then the content
  EXPECT_EQ(first[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first[1]["object"], "chat.completion.chunk");
  EXPECT_EQ(first[1]["choices"][0]["delta"]["content"], "Hel");
  EXPECT_TRUE(first[1]["usage"].is_null());
  const Json& lp = first[1]["choices"][0]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], "t5");
  EXPECT_FLOAT_EQ(lp["logprob"].get<float>(), -0.5f);  // token_logprobs, not the candidate's
  EXPECT_EQ(lp["top_logprobs"].size(), 1u);
  EXPECT_FLOAT_EQ(lp["top_logprobs"][0]["logprob"].get<float>(), -0.25f);
  EXPECT_FALSE(done);
  std::vector<Json> last = Events(responder.StreamEvents(Final()), &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(last.size(), 2u);  // the finish, then the usage
  EXPECT_EQ(last[0]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(last[1]["choices"].empty());
  EXPECT_EQ(last[1]["usage"]["total_tokens"], 6);
}

TEST(OpenAiApiTest, CompletionBody) {
  absl::StatusOr<OpenAiRequest> r = Parse({{"prompt", "x"}, {"logprobs", 1}});
  ASSERT_TRUE(r.ok());
  OpenAiResponder responder(*r, "cmpl-1", "tiny", 100,
                            [](int32_t id) { return "t" + std::to_string(id); });
  responder.Add(Tokens({7, 8}, "ab"));
  responder.Add(Final());
  Json body = Json::parse(responder.Body());
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "tiny");
  EXPECT_EQ(body["choices"][0]["text"], "ab");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][0]["logprobs"]["tokens"], Json({"t7", "t8"}));
  EXPECT_FLOAT_EQ(body["choices"][0]["logprobs"]["top_logprobs"][1]["t8"].get<float>(), -0.25f);
  EXPECT_EQ(body["choices"][0]["logprobs"]["token_logprobs"], Json({-0.5, -0.5}));
  EXPECT_EQ(body["choices"][0]["logprobs"]["text_offset"], Json({0, 2}));
  EXPECT_EQ(body["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(body["usage"]["completion_tokens"], 2);
}

// echo + logprobs: the prompt's text leads, its tokens' entries lead the
// arrays (the first token's null), offsets run through prompt and output.
TEST(OpenAiApiTest, CompletionEchoWithPromptLogprobs) {
  absl::StatusOr<OpenAiRequest> r = Parse({{"prompt", {1, 2, 3}}, {"echo", true}, {"logprobs", 1}});
  ASSERT_TRUE(r.ok()) << r.status();
  OpenAiResponder responder(*r, "cmpl-1", "tiny", 100,
                            [](int32_t id) { return "t" + std::to_string(id); });
  v1::GenerateResponse m = Tokens({7}, "t7");
  v1::PromptLogprobs* p = m.mutable_prompt_logprobs();
  for (int32_t id : {1, 2, 3}) p->add_token_ids(id);
  for (float lp : {-1.0f, -3.0f}) {
    p->add_logprobs(lp);
    v1::TokenLogprob* c = p->add_top()->add_candidates();
    c->set_id(9);
    c->set_logprob(-0.125f);
  }
  responder.Add(m);
  responder.Add(Final());
  Json body = Json::parse(responder.Body());
  const Json& lp = body["choices"][0]["logprobs"];
  EXPECT_EQ(body["choices"][0]["text"], "t1t2t3t7");
  EXPECT_EQ(lp["tokens"], Json({"t1", "t2", "t3", "t7"}));
  EXPECT_EQ(lp["token_logprobs"], Json({nullptr, -1.0, -3.0, -0.5}));
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_FLOAT_EQ(lp["top_logprobs"][1]["t9"].get<float>(), -0.125f);
  EXPECT_EQ(lp["text_offset"], Json({0, 2, 4, 6}));
}

// n = 2: choices by index, each finishing on its own; [DONE] and the usage
// (the prompt once) only after the last.
TEST(OpenAiApiTest, StreamsSiblingChoices) {
  absl::StatusOr<OpenAiRequest> r = Parse(
      {{"prompt", "x"}, {"n", 2}, {"stream", true}, {"stream_options", {{"include_usage", true}}}});
  ASSERT_TRUE(r.ok()) << r.status();
  OpenAiResponder responder(*r, "cmpl-1", "tiny", 100,
                            [](int32_t id) { return "t" + std::to_string(id); });
  bool done = false;
  v1::GenerateResponse one = Tokens({4}, "b");
  one.set_index(1);
  std::vector<Json> e = Events(responder.StreamEvents(one), &done);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["index"], 1);
  EXPECT_EQ(e[0]["choices"][0]["text"], "b");
  v1::GenerateResponse fin1 = Final();
  fin1.set_index(1);
  fin1.mutable_final()->mutable_usage()->set_prompt_tokens(0);  // siblings past 0 say 0
  e = Events(responder.StreamEvents(fin1), &done);
  EXPECT_FALSE(done);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["index"], 1);
  EXPECT_EQ(e[0]["choices"][0]["finish_reason"], "length");
  e = Events(responder.StreamEvents(Final()), &done);
  EXPECT_TRUE(done);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0]["choices"][0]["index"], 0);
  EXPECT_EQ(e[1]["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(e[1]["usage"]["completion_tokens"], 4);
}

TEST(ApiKeysTest, ChecksBearerKeys) {
  ApiKeys keys({"k1", "secret-2"});
  EXPECT_TRUE(keys.Check("Bearer k1").ok());
  EXPECT_TRUE(keys.Check("bearer secret-2").ok());
  for (const char* bad : {"", "k1", "Bearer", "Bearer k2", "Bearer k1x", "Basic k1"}) {
    EXPECT_EQ(keys.Check(bad).code(), absl::StatusCode::kUnauthenticated) << bad;
  }
}

}  // namespace
}  // namespace moesh
