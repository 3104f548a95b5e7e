// OpenAiResponder: the OpenAI response bodies and streamed events made from
// the generation's messages (router/openai_response.cc).
#include "gtest/gtest.h"
#include "router/openai_api.h"
#include "router/openai_test_util.h"

namespace moesh {
namespace {

using Json = nlohmann::json;
using openai_testing::Events;
using openai_testing::Final;
using openai_testing::Parse;
using openai_testing::Tokens;

// Streamed chunks carry the response's constant fields (appended as text
// after the choices array: Events checks each is its whole object's dump).
TEST(OpenAiApiTest, StreamedChunksCarryTheConstantFields) {
  for (bool chat : {false, true}) {
    for (bool usage : {false, true}) {
      Json body = {{"stream", true}, {"stream_options", {{"include_usage", usage}}}};
      body[chat ? "messages" : "prompt"] =
          chat ? Json{{{"role", "user"}, {"content", "x"}}} : Json("x");
      absl::StatusOr<OpenAiRequest> r = Parse(body, chat);
      ASSERT_TRUE(r.ok()) << r.status();
      OpenAiResponder responder(*r, "cmpl-\"1", "tiny", 100, [](int32_t) { return "t"; });
      bool done = false;
      const std::vector<Json> events = Events(
          responder.StreamEvents(Tokens({5}, "Hel\n")) + responder.StreamEvents(Final()), &done);
      EXPECT_TRUE(done);
      EXPECT_EQ(events.size(), 2u + chat + usage);  // (role,) content, finish (, usage)
      for (const Json& j : events) {
        EXPECT_EQ(j["id"], "cmpl-\"1");
        EXPECT_EQ(j["object"], chat ? "chat.completion.chunk" : "text_completion");
        EXPECT_EQ(j.contains("usage"), usage);
      }
    }
  }
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

// return_tokens_as_token_ids (vLLM's extension): the entries name the token
// ids, the text and its offsets stay the text's.
TEST(OpenAiApiTest, TokensAsTokenIds) {
  absl::StatusOr<OpenAiRequest> r =
      Parse({{"prompt", {1, 2}}, {"logprobs", 1}, {"return_tokens_as_token_ids", true}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->tokens_as_ids);
  OpenAiResponder responder(*r, "cmpl-1", "tiny", 100,
                            [](int32_t id) { return "t" + std::to_string(id); });
  responder.Add(Tokens({7, 12}, "t7t12"));
  responder.Add(Final());
  const Json body = Json::parse(responder.Body());
  const Json& lp = body["choices"][0]["logprobs"];
  EXPECT_EQ(body["choices"][0]["text"], "t7t12");
  EXPECT_EQ(lp["tokens"], Json({"token_id:7", "token_id:12"}));
  EXPECT_EQ(lp["token_logprobs"], Json({-0.5, -0.5}));
  EXPECT_FLOAT_EQ(lp["top_logprobs"][1]["token_id:12"].get<float>(), -0.25f);
  EXPECT_EQ(lp["text_offset"], Json({0, 2}));
  EXPECT_EQ(Parse({{"prompt", "x"}, {"return_tokens_as_token_ids", 3}}).status().code(),
            absl::StatusCode::kInvalidArgument);
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

// The shipped DeepSeek-R1 template (tests/golden/chat_template/).

}  // namespace
}  // namespace moesh
