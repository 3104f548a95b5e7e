// libFuzzer target: the HTTP API's request parsing and chat rendering, as
// router/http_front.cc runs them on a body. The input is a request body
// (JSON, or not); it goes through ParseOpenAiRequest for /v1/completions and
// for /v1/chat/completions, a refusal becomes OpenAI's error JSON
// (ToHttpError, whose message may quote the input), and a chat request that
// parses renders its messages through RenderChatPrompt with the chat
// template `moesh mkmodel` writes (DeepSeek-V3's) and DeepSeek-V3.2's and
// V4's encoders.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/tokenizer/chat_template.h"
#include "router/openai_api.h"

namespace {

std::vector<std::unique_ptr<moesh::ChatTemplate>>* MakeTemplates() {
  auto* t = new std::vector<std::unique_ptr<moesh::ChatTemplate>>;
  absl::StatusOr<std::unique_ptr<moesh::ChatTemplate>> v3 = moesh::ChatTemplate::FromText(
      moesh::kDeepSeekV3ChatTemplate, "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>");
  if (!v3.ok()) abort();
  t->push_back(std::move(*v3));
  t->push_back(moesh::ChatTemplate::ForEncoder(moesh::ChatTemplate::Family::kV32));
  t->push_back(moesh::ChatTemplate::ForEncoder(moesh::ChatTemplate::Family::kV4));
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::unique_ptr<moesh::ChatTemplate>>* const templates = MakeTemplates();
  const absl::string_view body(reinterpret_cast<const char*>(data), size);
  for (const bool chat : {false, true}) {
    absl::StatusOr<moesh::OpenAiRequest> r = moesh::ParseOpenAiRequest(body, chat);
    if (!r.ok()) {
      (void)moesh::ToHttpError(r.status());
      continue;
    }
    if (!chat) continue;
    for (const auto& t : *templates) {
      moesh::OpenAiRequest copy = *r;
      absl::StatusOr<std::string> prompt = moesh::RenderChatPrompt(*t, &copy);
      if (!prompt.ok()) (void)moesh::ToHttpError(prompt.status());
    }
  }
  return 0;
}
