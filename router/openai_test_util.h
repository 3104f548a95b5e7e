// The OpenAI API tests' helpers (router/openai_api_test.cc,
// router/openai_response_test.cc): a request from JSON, backend messages, and
// a stream's events.
#ifndef MOESH_ROUTER_OPENAI_TEST_UTIL_H_
#define MOESH_ROUTER_OPENAI_TEST_UTIL_H_

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "router/openai_api.h"

namespace moesh::openai_testing {

using Json = nlohmann::json;

inline absl::StatusOr<OpenAiRequest> Parse(const Json& j, bool chat = false) {
  return ParseOpenAiRequest(j.dump(), chat);
}

// Tokens `ids` (each with its own log-probability -0.5 and two candidates:
// itself at -0.25, id + 1 at -2) and their text.
inline v1::GenerateResponse Tokens(std::vector<int32_t> ids, std::string text) {
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

inline v1::GenerateResponse Final() {
  v1::GenerateResponse m;
  m.mutable_final()->set_finish_reason(v1::FINISH_REASON_LENGTH);
  m.mutable_final()->mutable_usage()->set_prompt_tokens(4);
  m.mutable_final()->mutable_usage()->set_completion_tokens(2);
  return m;
}

inline std::vector<Json> Events(const std::string& sse, bool* done) {
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
    } else {  // each event exactly its whole object's dump (keys sorted)
      out.push_back(Json::parse(line.substr(6)));
      EXPECT_EQ(line.substr(6), DumpJson(out.back()));
    }
    at = end + 2;
  }
  return out;
}

}  // namespace moesh::openai_testing

#endif  // MOESH_ROUTER_OPENAI_TEST_UTIL_H_
