// The bench's client of an OpenAI-compatible HTTP server (moesh's router
// with --http_listen, or any other server of the API: vLLM, SGLang, ...):
// streamed POST /v1/completions over a plain socket, so that each SSE event
// is timed as it arrives, and GET for /v1/models. IPv4 and loopback only
// (no TLS, no DNS): a benchmark's client next to the server.
#ifndef MOESH_CLI_HTTP_COMPLETION_H_
#define MOESH_CLI_HTTP_COMPLETION_H_

#include <chrono>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cli/serving_workload.h"
#include "nlohmann/json.hpp"

namespace moesh::cli {

struct HttpEndpoint {
  std::string host;  // an IPv4 address ("localhost" is taken as 127.0.0.1)
  int port = 0;
  std::string authority;  // HOST:PORT, the Host header
  std::string api_key;    // sent as "Authorization: Bearer <key>" when not empty
};

// "http://HOST:PORT" (a trailing "/" or "/v1" allowed) or "HOST:PORT".
// INVALID_ARGUMENT for anything else (https, a name other than localhost, no
// port).
absl::StatusOr<HttpEndpoint> ParseHttpEndpoint(absl::string_view url);

// Whether `server` names an HTTP endpoint ("http://..."), not a gRPC one.
bool IsHttpServer(absl::string_view server);

// The body of GET `path`'s 200 answer; UNAVAILABLE naming the status line
// (or the connection's failure) otherwise.
absl::StatusOr<std::string> HttpGet(const HttpEndpoint& to, const std::string& path,
                                    std::chrono::seconds timeout);

// One streamed completion: POST /v1/completions with `body` (the request's
// JSON object: prompt, max_tokens, sampling; this sets stream and
// stream_options.include_usage), timed as StreamGenerate times a Generate
// call: TTFT at the first event carrying tokens, and an event of k tokens
// adds k gaps of its gap / k. With `token_ids`, it also asks for logprobs 0
// and return_tokens_as_token_ids (which vLLM and moesh honour): the tokens
// come from the events' log-probability entries ("token_id:<id>", into
// `output`); without (or from a server that names them otherwise) each event
// counts one token, its gap a chunk's. prompt_tokens, output_tokens and
// cached_tokens (prompt_tokens_details) come from the usage. An HTTP error is
// the gRPC code of the same meaning (429 RESOURCE_EXHAUSTED, 400/404/413/422
// INVALID_ARGUMENT, 401 UNAUTHENTICATED, 503 UNAVAILABLE, else UNKNOWN) with
// the server's message; a stream without a usage is UNKNOWN.
// keep_alive: the request goes on this thread's kept connection to the
// server if it has one (a new one if the server closed it meanwhile), and
// the connection is kept for the thread's next request when the server
// keeps it (as clients with a connection pool do; the open-loop bench's
// conversations and the serving table's streams alike); else a connection of
// its own, closed after the answer.
RequestRecord StreamCompletion(const HttpEndpoint& to, nlohmann::json body, bool token_ids,
                               std::chrono::seconds timeout, bool keep_alive = true);

}  // namespace moesh::cli

#endif  // MOESH_CLI_HTTP_COMPLETION_H_
