// The router's OpenAI-compatible HTTP API (--http_listen): POST
// /v1/completions and /v1/chat/completions (JSON, or Server-Sent Events with
// "stream": true), GET /v1/models and GET /health. A thin adapter: each
// request is translated (router/openai_api.h) into a moesh.v1.GenerateRequest
// and run by GenerationService::Serve, the path gRPC's Generate takes, so
// validation, limits, stop strings, metrics, Abort and drain are the same.
//
// Served by civetweb (already linked for /metrics through prometheus-cpp):
// one civetweb thread per connection from a fixed pool, each request run on a
// thread of our own pool (civetweb's stacks are too small) while the
// connection's thread waits; a streaming client that goes away makes the next
// write fail, which stops its request (its KV is freed). HTTP/1.1
// connections stay open between requests (keep-alive, up to keep_alive_ms
// idle: an idle connection holds a civetweb thread); streams use chunked
// transfer encoding. Thread-safe; destroying it stops serving: running
// requests stop at their next token.
#ifndef MOESH_ROUTER_HTTP_FRONT_H_
#define MOESH_ROUTER_HTTP_FRONT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tokenizer/chat_template.h"
#include "router/api_keys.h"
#include "router/generation_service.h"
#include "router/text_codec.h"

struct mg_connection;
struct mg_context;

namespace moesh {

struct HttpFrontOptions {
  std::string listen;  // host:port; port 0: any free one
  int threads = 128;   // connections served at once
  // How long an idle keep-alive connection keeps its thread for the
  // client's next request; 0: each response closes its connection.
  int keep_alive_ms = 2000;
  int64_t max_body_bytes = 8 << 20;
  // The names a request's "model" may give (empty matches any); the first is
  // the one /v1/models lists and responses carry. REQUIRES: not empty.
  std::vector<std::string> model_names;
  int max_context_tokens = 0;  // listed by /v1/models
  // Listed by /v1/models as "vocab_size" (an extension: a benchmark drawing
  // random token-id prompts needs it); 0: left out.
  int vocab_size = 0;
  // Why chat completions are refused, where there is no chat template.
  std::string no_chat_reason =
      "the model has no chat template (tokenizer_config.json's chat_template)";
};

class HttpFront {
 public:
  // Serves on options.listen. `generation` must outlive the front; `codec`,
  // `chat` (chat completions are refused without one), `keys` (no key
  // needed without) may be null and, when not, outlive it. `ready` says
  // whether /health answers 200 (else 503). UNAVAILABLE when it cannot bind.
  static absl::StatusOr<std::unique_ptr<HttpFront>> Start(
      HttpFrontOptions options, GenerationService* generation, const TextCodec* codec,
      const ChatTemplate* chat, const ApiKeys* keys, std::function<bool()> ready);
  ~HttpFront();

  int port() const { return port_; }

 private:
  HttpFront(HttpFrontOptions options, GenerationService* generation, const TextCodec* codec,
            const ChatTemplate* chat, const ApiKeys* keys, std::function<bool()> ready);
  static int Handle(mg_connection* conn, void* self);
  int Route(mg_connection* conn);
  int Completions(mg_connection* conn, bool chat);
  int Models(mg_connection* conn);

  const HttpFrontOptions options_;
  const bool keep_alive_ = options_.keep_alive_ms > 0;  // civetweb's user data
  GenerationService* const generation_;
  const TextCodec* const codec_;
  const ChatTemplate* const chat_;
  const ApiKeys* const keys_;
  const std::function<bool()> ready_;
  const int64_t created_;  // Unix seconds: /v1/models' "created"
  std::atomic<int64_t> next_id_{0};
  std::atomic<bool> stopping_{false};
  mg_context* ctx_ = nullptr;
  int port_ = 0;
  // Runs the requests (as many threads as connections are served at once);
  // joined after ctx_ stopped.
  ThreadPool pool_;
};

}  // namespace moesh

#endif  // MOESH_ROUTER_HTTP_FRONT_H_
