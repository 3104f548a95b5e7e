#include "cli/http_completion.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace moesh::cli {
namespace {

using Clock = std::chrono::steady_clock;

// A socket connected to `to` with send and receive timeouts; closed on
// destruction.
class Connection {
 public:
  ~Connection() {
    if (fd_ >= 0) close(fd_);
  }
  absl::Status Open(const HttpEndpoint& to, std::chrono::seconds timeout) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    if (fd_ < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
    timeval tv = {};
    tv.tv_sec = static_cast<time_t>(timeout.count());
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(to.port));
    if (inet_pton(AF_INET, to.host.c_str(), &addr.sin_addr) != 1 ||
        connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot connect to ", to.authority, ": ", std::strerror(errno)));
    }
    return absl::OkStatus();
  }
  absl::Status Send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return absl::UnavailableError(absl::StrCat("send: ", std::strerror(errno)));
      sent += static_cast<size_t>(n);
    }
    return absl::OkStatus();
  }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

std::string RequestHead(const HttpEndpoint& to, const char* method, const std::string& path,
                        size_t body_bytes, bool keep_alive = false) {
  std::string head = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: ", to.authority,
                                  keep_alive ? "" : "\r\nConnection: close",
                                  "\r\nAccept: text/event-stream, */*\r\n");
  if (!to.api_key.empty()) absl::StrAppend(&head, "Authorization: Bearer ", to.api_key, "\r\n");
  if (body_bytes > 0) {
    absl::StrAppend(&head, "Content-Type: application/json\r\nContent-Length: ", body_bytes,
                    "\r\n");
  }
  return head + "\r\n";
}

// Reads the response on `c`: its status (*status, *status_line), then its
// body as it arrives, de-chunked, a piece at a time to `on_body` (false
// stops reading). The body ends at its Content-Length, its last chunk, or
// the connection's end. *reusable (may be null): the whole response was read
// to its stated end and the server keeps the connection (HTTP/1.1, no
// "Connection: close"). UNAVAILABLE for a connection that fails or ends
// before the head, or a malformed chunk.
absl::Status ReadResponse(Connection* c, int* status, std::string* status_line,
                          const std::function<bool(absl::string_view)>& on_body,
                          bool* reusable = nullptr, bool* answered = nullptr) {
  std::string buf;
  char tmp[16384];
  bool in_head = true, chunked = false, keeps = false;
  int64_t chunk_left = -1;  // -1: a size line next; 0: the CRLF after a chunk
  int64_t body_left = -1;   // Content-Length's bytes still to come; -1: none stated
  bool last_chunk = false;  // the zero chunk came: its final CRLF next
  if (reusable != nullptr) *reusable = false;
  if (answered != nullptr) *answered = false;  // any byte of a response came
  for (;;) {
    if (!in_head && !chunked && body_left == 0) break;
    const ssize_t n = recv(c->fd(), tmp, sizeof(tmp), 0);
    if (n < 0) {
      const std::string where = in_head ? " before the response" : " mid-response";
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return absl::DeadlineExceededError(absl::StrCat("timed out", where));
      return absl::UnavailableError(absl::StrCat(std::strerror(errno), where));
    }
    if (n == 0) break;
    if (answered != nullptr) *answered = true;
    buf.append(tmp, static_cast<size_t>(n));
    if (in_head) {
      const size_t end = buf.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      *status_line = buf.substr(0, buf.find("\r\n"));
      const std::vector<absl::string_view> parts = absl::StrSplit(*status_line, ' ');
      if (parts.size() < 2 || !absl::StartsWith(parts[0], "HTTP/1.") ||
          !absl::SimpleAtoi(parts[1], status)) {
        return absl::UnavailableError(absl::StrCat("not an HTTP response: ", *status_line));
      }
      const std::string head = absl::AsciiStrToLower(buf.substr(0, end));
      chunked = absl::StrContains(head, "transfer-encoding: chunked");
      keeps = absl::StartsWith(*status_line, "HTTP/1.1") &&
              !absl::StrContains(head, "connection: close");
      if (const size_t at = head.find("\r\ncontent-length:"); at != std::string::npos && !chunked) {
        const size_t from = at + 17, eol = head.find("\r\n", from);
        if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(absl::string_view(head).substr(
                                  from, eol == std::string::npos ? std::string::npos : eol - from)),
                              &body_left) ||
            body_left < 0) {
          return absl::UnavailableError("a malformed Content-Length in the response");
        }
      }
      buf.erase(0, end + 4);
      in_head = false;
    }
    if (!chunked) {
      if (body_left >= 0 && static_cast<int64_t>(buf.size()) > body_left) {
        return absl::UnavailableError("more bytes than the response's Content-Length");
      }
      if (body_left > 0) body_left -= static_cast<int64_t>(buf.size());
      if (!buf.empty() && !on_body(buf)) return absl::OkStatus();
      buf.clear();
      if (body_left == 0) {
        if (reusable != nullptr) *reusable = keeps;
        return absl::OkStatus();
      }
      continue;
    }
    for (;;) {
      if (last_chunk) {  // the zero chunk's CRLF (no trailers are sent here)
        if (buf.size() < 2) break;
        if (reusable != nullptr) *reusable = keeps && buf == "\r\n";
        return absl::OkStatus();
      }
      if (chunk_left < 0) {
        const size_t eol = buf.find("\r\n");
        if (eol == std::string::npos) break;
        absl::string_view size_text = absl::string_view(buf).substr(0, eol);
        size_text = size_text.substr(0, size_text.find(';'));  // chunk extensions
        uint64_t size = 0;
        if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(size_text), &size)) {
          return absl::UnavailableError("a malformed chunk size in the response");
        }
        buf.erase(0, eol + 2);
        if (size == 0) {
          last_chunk = true;
          continue;
        }
        chunk_left = static_cast<int64_t>(size);
      }
      if (chunk_left > 0) {
        const size_t take = std::min<size_t>(static_cast<size_t>(chunk_left), buf.size());
        if (take == 0) break;
        if (!on_body(absl::string_view(buf).substr(0, take))) return absl::OkStatus();
        buf.erase(0, take);
        chunk_left -= static_cast<int64_t>(take);
      }
      if (chunk_left == 0) {
        if (buf.size() < 2) break;
        buf.erase(0, 2);
        chunk_left = -1;
      }
    }
  }
  if (in_head) return absl::UnavailableError("the connection closed before a response");
  if (last_chunk) return absl::OkStatus();  // closed instead of the final CRLF: not reusable
  if (!chunked && body_left > 0) return absl::UnavailableError("the response ended early");
  return absl::OkStatus();
}

// This thread's connection to a server that keeps it (one at a time: a
// closed-loop stream's requests run one after another on its thread).
struct KeptConnection {
  std::string authority;
  std::unique_ptr<Connection> conn;
};
thread_local KeptConnection kept;

// This thread's kept connection to `to`, unless the server has closed it
// meanwhile (a peek finds its end, or an error).
std::unique_ptr<Connection> TakeKept(const HttpEndpoint& to) {
  if (kept.conn == nullptr || kept.authority != to.authority) return nullptr;
  std::unique_ptr<Connection> c = std::move(kept.conn);
  char byte;
  const ssize_t n = recv(c->fd(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return nullptr;
  return c;
}

grpc::StatusCode CodeOfHttp(int status) {
  switch (status) {
    case 400:
    case 404:
    case 413:
    case 422:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case 401:
      return grpc::StatusCode::UNAUTHENTICATED;
    case 429:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case 503:
      return grpc::StatusCode::UNAVAILABLE;
    default:
      return grpc::StatusCode::UNKNOWN;
  }
}

// An error body's message (OpenAI's {"error": {"message": ...}}, else the
// text itself).
std::string ErrorMessage(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    const nlohmann::json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      return e["message"].get<std::string>();
    if (e.is_string()) return e.get<std::string>();
  }
  return body.substr(0, 300);
}

}  // namespace

bool IsHttpServer(absl::string_view server) { return absl::StartsWith(server, "http://"); }

absl::StatusOr<HttpEndpoint> ParseHttpEndpoint(absl::string_view url) {
  absl::string_view rest = url;
  if (absl::StartsWith(rest, "https://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", url, "\": https is not supported (the bench speaks plain HTTP)"));
  }
  absl::ConsumePrefix(&rest, "http://");
  absl::ConsumeSuffix(&rest, "/");
  absl::ConsumeSuffix(&rest, "/v1");
  const size_t colon = rest.rfind(':');
  HttpEndpoint e;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(colon + 1), &e.port) ||
      e.port < 1 || e.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", url, "\": expected http://HOST:PORT (HOST an IPv4 address)"));
  }
  e.host = std::string(rest.substr(0, colon));
  if (e.host == "localhost") e.host = "127.0.0.1";
  in_addr probe;
  if (inet_pton(AF_INET, e.host.c_str(), &probe) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", url, "\": the host must be an IPv4 address or localhost"));
  }
  e.authority = std::string(rest);
  return e;
}

absl::StatusOr<std::string> HttpGet(const HttpEndpoint& to, const std::string& path,
                                    std::chrono::seconds timeout) {
  Connection c;
  if (absl::Status s = c.Open(to, timeout); !s.ok()) return s;
  if (absl::Status s = c.Send(RequestHead(to, "GET", path, 0)); !s.ok()) return s;
  int status = 0;
  std::string status_line, body;
  absl::Status s = ReadResponse(&c, &status, &status_line, [&](absl::string_view piece) {
    body.append(piece.data(), piece.size());
    return true;
  });
  if (!s.ok()) return s;
  if (status != 200) {
    return absl::UnavailableError(
        absl::StrCat("GET ", path, ": ", status_line, ": ", ErrorMessage(body)));
  }
  return body;
}

RequestRecord StreamCompletion(const HttpEndpoint& to, nlohmann::json body, bool token_ids,
                               std::chrono::seconds timeout, bool keep_alive) {
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  if (token_ids) {
    body["logprobs"] = 0;
    body["return_tokens_as_token_ids"] = true;
  }
  const std::string payload = body.dump();
  RequestRecord rec;
  const auto t0 = Clock::now();
  auto last = t0;
  bool first = true, usage = false;
  std::string error, events, error_body;
  int status = 0;
  std::string status_line;
  // One SSE event's JSON: its tokens timed, its usage kept.
  auto on_event = [&](const nlohmann::json& j) {
    if (j.contains("error")) {
      error = ErrorMessage(j.dump());
      return false;
    }
    if (j.contains("usage") && j["usage"].is_object()) {
      const nlohmann::json& u = j["usage"];
      usage = true;
      rec.prompt_tokens = u.value("prompt_tokens", 0);
      rec.output_tokens = u.value("completion_tokens", 0);
      if (u.contains("prompt_tokens_details") && u["prompt_tokens_details"].is_object())
        rec.cached_tokens = u["prompt_tokens_details"].value("cached_tokens", 0);
    }
    if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return true;
    const nlohmann::json& choice = j["choices"][0];
    int tokens = 0;
    const nlohmann::json* names = nullptr;
    if (choice.contains("logprobs") && choice["logprobs"].is_object() &&
        choice["logprobs"].contains("tokens") && choice["logprobs"]["tokens"].is_array()) {
      names = &choice["logprobs"]["tokens"];
      tokens = static_cast<int>(names->size());
      for (const nlohmann::json& name : *names) {
        if (!name.is_string()) continue;
        int32_t id = 0;
        absl::string_view v = name.get_ref<const std::string&>();  // no copy: v views the JSON
        if (absl::ConsumePrefix(&v, "token_id:") && absl::SimpleAtoi(v, &id)) {
          rec.output.push_back(id);
        }
      }
    } else if (choice.contains("text") && choice["text"].is_string() &&
               !choice["text"].get_ref<const std::string&>().empty()) {
      tokens = 1;  // a server that names no tokens: an event a token
    }
    if (tokens == 0) return true;
    const auto now = Clock::now();
    if (first) {
      rec.ttft = std::chrono::duration<double>(now - t0).count();
      first = false;
    } else {
      const double since = std::chrono::duration<double>(now - last).count();
      for (int k = 0; k < tokens; ++k) rec.itl.push_back(since / tokens);
    }
    last = now;
    return true;
  };
  const auto on_piece = [&](absl::string_view piece) {
    if (status != 200) {
      error_body.append(piece.data(), piece.size());
      return true;
    }
    events.append(piece.data(), piece.size());
    for (size_t end; (end = events.find("\n\n")) != std::string::npos; events.erase(0, end + 2)) {
      absl::string_view event =
          absl::StripTrailingAsciiWhitespace(absl::string_view(events).substr(0, end));
      if (!absl::ConsumePrefix(&event, "data:")) continue;  // comments, other fields
      event = absl::StripLeadingAsciiWhitespace(event);
      if (event == "[DONE]") continue;
      const nlohmann::json j = nlohmann::json::parse(event, nullptr, false);
      if (j.is_discarded()) {
        error = absl::StrCat("not JSON: ", event.substr(0, 200));
        return false;
      }
      if (!on_event(j)) return false;
    }
    return true;
  };
  // A kept connection the server closes just as the request goes (its
  // idle timeout) ends without a byte of answer, or refuses the send: the
  // request goes again, once, on a new connection. A timeout is not retried
  // (the server may be running the request).
  std::unique_ptr<Connection> c = keep_alive ? TakeKept(to) : nullptr;
  const bool reused = c != nullptr;
  const std::string request =
      RequestHead(to, "POST", "/v1/completions", payload.size(), keep_alive) + payload;
  absl::Status s;
  bool reusable = false, answered = false;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (c == nullptr) {
      c = std::make_unique<Connection>();
      s = c->Open(to, timeout);
    }
    if (s.ok()) s = c->Send(request);
    if (s.ok()) s = ReadResponse(c.get(), &status, &status_line, on_piece, &reusable, &answered);
    if (s.ok() || !reused || attempt > 0 || answered || absl::IsDeadlineExceeded(s)) break;
    c.reset();
    s = absl::OkStatus();
  }
  if (keep_alive && s.ok() && reusable) kept = {to.authority, std::move(c)};
  rec.e2e = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!s.ok()) {
    rec.code = grpc::StatusCode::UNAVAILABLE;
    rec.error = std::string(s.message());
  } else if (status != 200) {
    rec.code = CodeOfHttp(status);
    rec.error = absl::StrCat(status_line, ": ", ErrorMessage(error_body));
  } else if (!error.empty()) {
    rec.code = grpc::StatusCode::UNKNOWN;
    rec.error = error;
  } else if (!usage) {
    rec.code = grpc::StatusCode::UNKNOWN;
    rec.error = "the stream ended without a usage";
  }
  if (rec.output_tokens == 0) rec.output_tokens = static_cast<int>(rec.output.size());
  return rec;
}

}  // namespace moesh::cli
