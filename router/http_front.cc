#include "router/http_front.h"

#include <civetweb.h>

#include <algorithm>
#include <chrono>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/metrics/civetweb_stop.h"
#include "router/openai_api.h"

namespace moesh {
namespace {

// civetweb's reason for a failed start: it logs through the callback, then
// mg_start returns null.
thread_local std::string start_error;

int LogMessage(const mg_connection*, const char* message) {
  if (message != nullptr) start_error += (start_error.empty() ? "" : "; ") + std::string(message);
  return 1;  // logged here: civetweb prints nothing
}

// A request's connection data once its body has been read whole (reset as
// each request starts: civetweb keeps the data with the connection).
char body_read_mark;

bool Http11(mg_connection* conn) {
  const char* v = mg_get_request_info(conn)->http_version;
  return v != nullptr && std::string(v) != "1.0";
}

// Whether the request announced a body that has not been read whole: civetweb
// would wait for the rest (however much was announced) before the next
// request, so the connection ends with this response instead.
bool BodyLeft(mg_connection* conn) {
  const bool announced = mg_get_request_info(conn)->content_length > 0 ||
                         mg_get_header(conn, "Transfer-Encoding") != nullptr;
  return announced && mg_get_user_connection_data(conn) != &body_read_mark;
}

// Every response states its length (Content-Length, or chunked transfer
// encoding for a stream), so an HTTP/1.1 connection stays open for the
// client's next request (civetweb's keep-alive) unless this front keeps
// none, the client asked to close, the request is HTTP/1.0, its body was
// left unread, or `close` (a stream that cannot be framed).
void WriteHead(mg_connection* conn, int status, const char* content_type, bool close) {
  // The context's user data: whether this front keeps connections at all.
  const bool* keep_alive = static_cast<const bool*>(mg_get_user_data(mg_get_context(conn)));
  const char* connection = mg_get_header(conn, "Connection");
  close = close || keep_alive == nullptr || !*keep_alive || !Http11(conn) || BodyLeft(conn) ||
          (connection != nullptr && absl::StrContains(absl::AsciiStrToLower(connection), "close"));
  if (close) mg_disable_connection_keep_alive(conn);
  mg_printf(conn, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nCache-Control: no-cache\r\n%s", status,
            mg_get_response_code_text(conn, status), content_type,
            close ? "Connection: close\r\n" : "");
}

// A JSON answer; to HEAD, its head alone.
int SendJson(mg_connection* conn, int status, const std::string& body) {
  WriteHead(conn, status, "application/json", /*close=*/false);
  mg_printf(conn, "Content-Length: %zu\r\n\r\n", body.size());
  const char* method = mg_get_request_info(conn)->request_method;
  if (method == nullptr || std::string(method) != "HEAD") mg_write(conn, body.data(), body.size());
  return status;
}

// A Server-Sent Events stream: chunked on HTTP/1.1 (one write a chunk: its
// size line, the events, CRLF), plain bytes until the connection closes on
// HTTP/1.0. Write is false once the client is gone; after a failed write
// nothing more is written (a chunk may be cut short) and the connection ends.
class EventStream {
 public:
  explicit EventStream(mg_connection* conn) : conn_(conn), chunked_(Http11(conn)) {}
  bool started() const { return started_; }
  void Start() {
    started_ = true;
    WriteHead(conn_, 200, "text/event-stream", !chunked_);
    mg_printf(conn_, chunked_ ? "Transfer-Encoding: chunked\r\n\r\n" : "\r\n");
  }
  bool Write(const std::string& events) {
    if (failed_) return false;
    if (events.empty()) return true;
    const std::string chunk =
        chunked_ ? absl::StrCat(absl::Hex(events.size()), "\r\n", events, "\r\n") : events;
    if (mg_write(conn_, chunk.data(), chunk.size()) != static_cast<int>(chunk.size())) {
      failed_ = true;
      mg_disable_connection_keep_alive(conn_);
    }
    return !failed_;
  }
  void End() {
    if (chunked_ && !failed_) mg_write(conn_, "0\r\n\r\n", 5);
  }

 private:
  mg_connection* const conn_;
  const bool chunked_;
  bool started_ = false, failed_ = false;
};

int SendError(mg_connection* conn, const absl::Status& status) {
  const HttpError e = ToHttpError(status);
  return SendJson(conn, e.http_status, e.body);
}

// A non-API error (unknown path, wrong method) in OpenAI's shape.
int SendPlainError(mg_connection* conn, int status, const std::string& message) {
  const nlohmann::json e = {{"error",
                             {{"message", message},
                              {"type", "invalid_request_error"},
                              {"param", nullptr},
                              {"code", nullptr}}}};
  return SendJson(conn, status, DumpJson(e));
}

// The body, or OUT_OF_RANGE (413) past `limit` bytes: refused from its
// Content-Length before reading when it states one. INVALID_ARGUMENT for a
// body that ends before its Content-Length or cannot be read (the client
// stopped sending it).
absl::StatusOr<std::string> ReadBody(mg_connection* conn, int64_t limit) {
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri->content_length > limit) return BodyTooLargeError(limit);
  std::string body;
  char buf[16384];
  int n;
  while ((n = mg_read(conn, buf, sizeof(buf))) > 0) {
    body.append(buf, n);
    if (static_cast<int64_t>(body.size()) > limit) return BodyTooLargeError(limit);
  }
  if (n < 0 ||
      (ri->content_length >= 0 && static_cast<int64_t>(body.size()) < ri->content_length)) {
    return absl::InvalidArgumentError(absl::StrCat("the request body ended after ", body.size(),
                                                   " bytes", n < 0 ? " (a read failed)" : ""));
  }
  mg_set_user_connection_data(conn, &body_read_mark);
  return body;
}

}  // namespace

HttpFront::HttpFront(HttpFrontOptions options, GenerationService* generation,
                     const TextCodec* codec, const ChatTemplate* chat, const ApiKeys* keys,
                     std::function<bool()> ready)
    : options_(std::move(options)),
      generation_(generation),
      codec_(codec),
      chat_(chat),
      keys_(keys),
      ready_(std::move(ready)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()) {}

absl::StatusOr<std::unique_ptr<HttpFront>> HttpFront::Start(
    HttpFrontOptions options, GenerationService* generation, const TextCodec* codec,
    const ChatTemplate* chat, const ApiKeys* keys, std::function<bool()> ready) {
  if (options.model_names.empty()) return absl::InvalidArgumentError("no model name to serve");
  std::unique_ptr<HttpFront> f(
      new HttpFront(std::move(options), generation, codec, chat, keys, std::move(ready)));
  const std::string threads = std::to_string(f->options_.threads);
  const std::string keep_alive_ms = std::to_string(f->options_.keep_alive_ms);
  const char* civet_options[] = {"listening_ports",
                                 f->options_.listen.c_str(),
                                 "num_threads",
                                 threads.c_str(),
                                 "tcp_nodelay",
                                 "1",
                                 "enable_keep_alive",
                                 f->options_.keep_alive_ms > 0 ? "yes" : "no",
                                 "keep_alive_timeout_ms",
                                 keep_alive_ms.c_str(),
                                 nullptr};
  mg_callbacks callbacks = {};
  callbacks.log_message = LogMessage;
  start_error.clear();
  f->ctx_ = mg_start(&callbacks, const_cast<bool*>(&f->keep_alive_), civet_options);
  if (f->ctx_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve HTTP on ", f->options_.listen, ": ", start_error));
  }
  mg_set_request_handler(f->ctx_, "/", &HttpFront::Handle, f.get());
  mg_server_port ports[4] = {};
  if (mg_get_server_ports(f->ctx_, 4, ports) > 0) f->port_ = ports[0].port;
  return f;
}

HttpFront::~HttpFront() {
  stopping_ = true;  // running requests stop at their next token
  if (ctx_ != nullptr) StopCivetweb(ListenHost(options_.listen), port_, [this] { mg_stop(ctx_); });
}

int HttpFront::Handle(mg_connection* conn, void* self) {
  // civetweb's threads have 100 KiB stacks (fixed when libcivetweb is built),
  // too small for a request's path (JSON, the tokenizer, gRPC calls): the
  // request runs on a thread of the pool while this one waits.
  HttpFront* front = static_cast<HttpFront*>(self);
  mg_set_user_connection_data(conn, nullptr);  // this request's body: not read yet
  absl::Notification done;
  int status = 500;
  front->pool_.Schedule([&] {
    status = front->Route(conn);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

int HttpFront::Route(mg_connection* conn) {
  const mg_request_info* ri = mg_get_request_info(conn);
  const std::string path = ri->local_uri != nullptr ? ri->local_uri : "";
  const std::string method = ri->request_method != nullptr ? ri->request_method : "";
  const bool post = method == "POST";
  if (path == "/health") {
    if (ready_ && !ready_()) {
      return SendError(conn, absl::UnavailableError("no workers are serving yet, or draining"));
    }
    return SendJson(conn, 200, "{}");
  }
  const bool known =
      path == "/v1/completions" || path == "/v1/chat/completions" || path == "/v1/models";
  if (!known) return SendPlainError(conn, 404, absl::StrCat("no such path: ", path));
  if (keys_ != nullptr) {
    const char* auth = mg_get_header(conn, "Authorization");
    if (absl::Status s = keys_->Check(auth != nullptr ? auth : ""); !s.ok()) {
      return SendError(conn, s);
    }
  }
  if (path == "/v1/models") {
    if (method != "GET") return SendPlainError(conn, 405, "use GET /v1/models");
    return Models(conn);
  }
  if (!post) return SendPlainError(conn, 405, absl::StrCat("use POST ", path));
  return Completions(conn, path == "/v1/chat/completions");
}

int HttpFront::Models(mg_connection* conn) {
  nlohmann::json model = {{"id", options_.model_names.front()},
                          {"object", "model"},
                          {"created", created_},
                          {"owned_by", "moesh"},
                          {"max_model_len", options_.max_context_tokens}};
  if (options_.vocab_size > 0) model["vocab_size"] = options_.vocab_size;
  return SendJson(conn, 200, DumpJson({{"object", "list"}, {"data", {model}}}));
}

int HttpFront::Completions(mg_connection* conn, bool chat) {
  absl::StatusOr<std::string> body = ReadBody(conn, options_.max_body_bytes);
  if (!body.ok()) return SendError(conn, body.status());  // its connection ends (BodyLeft)
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(*body, chat);
  if (!r.ok()) return SendError(conn, r.status());
  if (!r->model.empty() && std::find(options_.model_names.begin(), options_.model_names.end(),
                                     r->model) == options_.model_names.end()) {
    return SendError(conn, ModelNotFoundError(r->model));
  }
  // The output limit, named as the request named it (OpenAI's error param).
  if (const int limit = generation_->max_new_tokens_limit();
      r->generate.stop().has_max_new_tokens() && r->generate.stop().max_new_tokens() > limit) {
    const std::string& field = r->max_tokens_field;
    return SendError(
        conn, InvalidParamError(field, absl::StrCat(field, " must be at most ", limit, ", got ",
                                                    r->generate.stop().max_new_tokens())));
  }
  if (codec_ == nullptr) {
    return SendError(conn, absl::FailedPreconditionError(
                               "the model has no tokenizer.json: the HTTP API needs one"));
  }
  if (chat) {
    if (chat_ == nullptr) {
      return SendError(conn, absl::FailedPreconditionError(
                                 absl::StrCat(options_.no_chat_reason, ": use /v1/completions")));
    }
    absl::StatusOr<std::string> prompt = RenderChatPrompt(*chat_, &*r);
    if (!prompt.ok()) return SendError(conn, prompt.status());
    r->generate.set_text(std::move(*prompt));
    r->generate.set_add_special_tokens(false);  // the template wrote the BOS
  }
  const std::string rid = absl::StrCat("http-", ++next_id_);
  r->generate.set_request_id(rid);
  OpenAiResponder responder(*r, absl::StrCat(chat ? "chatcmpl-" : "cmpl-", rid),
                            options_.model_names.front(),
                            std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count(),
                            [this](int32_t id) { return codec_->Decode({id}, false); });
  EventStream stream(conn);
  ResponseWriter write = [&](const v1::GenerateResponse& m) {
    if (stopping_) return false;
    if (!r->stream) {
      responder.Add(m);
      return true;
    }
    if (!stream.started()) stream.Start();
    return stream.Write(responder.StreamEvents(m));
  };
  const absl::Status s = generation_->Serve(r->generate, write);
  if (!s.ok()) {
    if (!stream.started()) return SendError(conn, s);
    stream.Write(OpenAiResponder::StreamError(s));
    stream.End();
    return 200;
  }
  if (!r->stream) return SendJson(conn, 200, responder.Body());
  stream.End();
  return 200;
}

}  // namespace moesh
