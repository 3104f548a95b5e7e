// The OpenAI HTTP API's JSON, mapped onto moesh.v1.Generation: a
// /v1/completions or /v1/chat/completions body becomes a GenerateRequest (and
// chat messages), the Generate stream's messages become the API's responses
// and Server-Sent Event chunks, and an absl::Status becomes OpenAI's error
// JSON with its HTTP status. No I/O; router/http_front.h serves it.
//
// Accepted: model, prompt (a string, token ids, or a list of one of either),
// messages, stream, stream_options.include_usage, max_tokens,
// max_completion_tokens, temperature, top_p, seed, stop (a string or a list),
// presence_penalty, frequency_penalty, logprobs (completions: how many
// alternatives; chat: a bool, with top_logprobs; every token's entry carries
// its own log-probability, of the raw logits before penalties and
// temperature), n (sibling choices, GenerateRequest.n's limit), echo
// (completions: the prompt leads the text, and with logprobs its tokens'
// log-probabilities lead the arrays, the first token's null), and the
// extensions other servers accept too: top_k, min_p, repetition_penalty,
// ignore_eos, stop_token_ids. Chat: tools (function definitions, validated;
// DeepSeek's V3/R1 templates do not render them into the prompt, V3.2's and
// V4's encoders do unless tool_choice is "none"), tool_choice ("none": no
// calls parsed; "auto"; "required" and a named function: the assistant's turn
// is opened with the tool-call tokens (and the name), so the model completes
// a call), separate_reasoning (default true: an R1-style model's thinking
// goes to reasoning_content), chat_template_kwargs (a Jinja template gets
// each as a variable, as apply_chat_template's keyword arguments: e.g.
// DeepSeek-V3.1's `thinking`; {"thinking": bool} also switches V3.2's and
// V4's encoders to thinking mode, default off as DeepSeek's API for
// deepseek-chat; "enable_thinking" is read too), reasoning_effort ("max": V4's instruction
// for it; other values are accepted and change nothing), an assistant
// message's reasoning_content (V3.2, V4 render it where the reference
// encoders do). Unknown fields are
// ignored, as OpenAI does; a known field this server cannot honour (best_of,
// suffix, logit_bias, a response_format other than text) is INVALID_ARGUMENT
// naming it.
#ifndef MOESH_ROUTER_OPENAI_API_H_
#define MOESH_ROUTER_OPENAI_API_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/tokenizer/chat_template.h"
#include "moesh/v1/generation.pb.h"
#include "nlohmann/json.hpp"
#include "router/chat_output.h"

namespace moesh {

// A parsed request: the generation (its prompt set for completions; chat
// requests leave it to the caller, who renders `messages`) and how to answer.
struct OpenAiRequest {
  bool chat = false;
  std::string model;  // empty: not given
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // report log-probabilities
  int top_logprobs = 0;        // alternatives per token to report
  bool echo = false;           // completions: the prompt leads each choice
  // return_tokens_as_token_ids (vLLM's extension): log-probability entries
  // name their tokens "token_id:<id>" instead of their text, so a client
  // learns the ids (moesh bench --serving --server http://...).
  bool tokens_as_ids = false;
  // Which key set the output limit ("max_tokens" or chat's newer
  // "max_completion_tokens"), to name it in errors; empty: neither.
  std::string max_tokens_field;
  int n = 1;                          // choices
  std::vector<ChatMessage> messages;  // chat only
  v1::GenerateRequest generate;       // detokenize set; chat: no prompt yet
  // Chat: the function definitions (a validated array), and tool_choice:
  // "none", "auto", "required" or "function" (tool_choice_name the named one).
  nlohmann::json tools = nlohmann::json::array();
  std::string tool_choice = "auto";
  std::string tool_choice_name;
  // The function definitions as JSON texts, keys in the client's order
  // (PythonJsonDumps), for the encoders that render them.
  std::vector<std::string> tool_schemas;
  bool separate_reasoning = true;
  bool thinking = false;              // chat_template_kwargs.thinking
  std::string template_kwargs;        // chat_template_kwargs as JSON text ("" when absent)
  bool max_reasoning_effort = false;  // reasoning_effort "max"
  // Chat: how the generated text splits into reasoning, content and tool
  // calls (RenderChatPrompt sets it from the template), and the text the
  // prompt already opened the assistant's turn with (fed to the parser
  // first, never reported).
  ChatOutputParser::Options output;
  std::string forced_output;
};

// INVALID_ARGUMENT (with the offending field as the error's param, see
// ErrorParam) for malformed JSON, wrong types, out-of-range or unsupported
// values.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(absl::string_view body, bool chat);

// Chat: the prompt text of `r`'s messages in `chat_template`'s format, with
// the tool-call opening tool_choice forces; sets r->output and
// r->forced_output. INVALID_ARGUMENT for what the template cannot render
// (tool calls asked of a template without DeepSeek's tool format).
absl::StatusOr<std::string> RenderChatPrompt(const ChatTemplate& chat_template, OpenAiRequest* r);

// The field an INVALID_ARGUMENT from ParseOpenAiRequest names; empty if none.
std::string ErrorParam(const absl::Status& status);
// INVALID_ARGUMENT naming `param` (ErrorParam).
absl::Status InvalidParamError(absl::string_view param, absl::string_view message);

// OpenAI's error body {"error": {"message", "type", "param", "code"}} for
// `status` (not OK), and the HTTP status that goes with it: 400 invalid
// input, 401 a missing or wrong key, 404 an unknown model (NOT_FOUND), 409,
// 413 (OUT_OF_RANGE from the body limit: see BodyTooLargeError), 429 no room
// (RESOURCE_EXHAUSTED), 503 unavailable or draining, 504 a deadline, 500 the
// rest.
struct HttpError {
  int http_status = 500;
  std::string body;
};
HttpError ToHttpError(const absl::Status& status);
// `j` as compact JSON text; invalid UTF-8 in strings becomes U+FFFD.
std::string DumpJson(const nlohmann::json& j);
// The error a body over the limit gets (413).
absl::Status BodyTooLargeError(int64_t limit_bytes);
// The error an unknown model gets (404, code model_not_found).
absl::Status ModelNotFoundError(absl::string_view model);

// Turns one request's Generate stream into the API's JSON. Not thread-safe.
class OpenAiResponder {
 public:
  // `decode_token(id)` is a token's text (for log-probabilities); `created`
  // the Unix time stamped on every object.
  OpenAiResponder(const OpenAiRequest& request, std::string id, std::string model, int64_t created,
                  std::function<std::string(int32_t)> decode_token);

  // Streaming: the SSE events ("data: {...}\n\n") for message `m` (of
  // choice m.index()); a choice's final message adds its finish chunk, and
  // the last choice's the usage chunk (include_usage) and "data: [DONE]\n\n".
  std::string StreamEvents(const v1::GenerateResponse& m);
  // Not streaming: takes `m` in; Body() is the whole response once every
  // choice's final message was added.
  void Add(const v1::GenerateResponse& m);
  std::string Body() const;
  // The SSE event reporting an error after the stream started.
  static std::string StreamError(const absl::Status& status);

 private:
  // One choice's state.
  struct Choice {
    bool started = false;   // its first message came (the role, the echo were sent)
    bool done = false;      // its final message came
    std::string text;       // chat: the content
    std::string reasoning;  // chat
    std::vector<ParsedToolCall> tool_calls;    // chat
    std::unique_ptr<ChatOutputParser> parser;  // chat
    // Chat: the call the forced opening started (DSML reports it at its
    // header), for the choice's first delta.
    std::vector<ParsedToolCall> forced_calls;
    nlohmann::json logprobs;
    int text_offset = 0;  // completions: where the next token's text starts
    v1::FinalInfo final;
  };
  nlohmann::json ChunkBase() const;
  // Chat: `d` as a chunk's delta (empty fields left out).
  static nlohmann::json Delta(const ChatDelta& d);
  // Chat: a finished choice's finish_reason ("tool_calls" when it made any).
  static const char* ChatFinishReason(const Choice& c);
  // Usage over every choice's final (the prompt counted once).
  nlohmann::json Usage() const;
  // Log-probability entries of `m`'s tokens (echo: its prompt's first),
  // appended to `content` (chat) or to the completions' parallel arrays.
  void AddLogprobs(const v1::GenerateResponse& m, Choice* c, nlohmann::json* into) const;
  // One token's entry: `logprob` null for a prompt's first token.
  void AddEntry(int32_t id, const nlohmann::json& logprob, const v1::TopLogprobs* top, Choice* c,
                nlohmann::json* into) const;
  nlohmann::json EmptyLogprobs() const;
  // The prompt's text (echo).
  std::string PromptText() const;

  const OpenAiRequest& request_;
  const std::string id_;
  const std::string model_;
  const int64_t created_;
  const std::function<std::string(int32_t)> decode_token_;
  std::vector<Choice> choices_;
  int choices_done_ = 0;
  std::string chunk_tail_;  // a streamed chunk's text after its "choices" array
};

}  // namespace moesh

#endif  // MOESH_ROUTER_OPENAI_API_H_
