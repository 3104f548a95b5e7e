// The public moesh.v1.Generation API: validates requests (INVALID_ARGUMENT
// with a message, never touching other requests), resolves defaults and stop
// ids, hands the request to a GenerationBackend, and streams tokens back with
// a final message (finish reason, usage, timings).
//
// Generate is a callback-API stream: each request runs on a thread of the
// service's pool, and the client going away (cancel, deadline) or an Abort
// fires the request's CancelToken, which cancels its worker calls at once.
// Serve is the same path for the router's other front (the HTTP API,
// router/http_front.h): one request on the caller's thread.
// With api_keys set, every RPC needs the metadata `authorization: Bearer
// <key>` (UNAUTHENTICATED otherwise). Thread-safe.
#ifndef MOESH_ROUTER_GENERATION_SERVICE_H_
#define MOESH_ROUTER_GENERATION_SERVICE_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/cancel_token.h"
#include "base/thread_pool.h"
#include "common/metrics/metrics.h"
#include "common/model/config.h"
#include "common/rpc/blocking_write_reactor.h"
#include "moesh/v1/generation.grpc.pb.h"
#include "router/api_keys.h"
#include "router/backend.h"
#include "router/text_codec.h"

namespace moesh {

struct GenerationServiceOptions {
  int default_max_new_tokens = 256;
  int max_new_tokens_limit = 4096;
  // Prompt + output limit; 0: the model's max_position_embeddings.
  int max_context_tokens = 0;
  Metrics* metrics = nullptr;         // may be null
  const ApiKeys* api_keys = nullptr;  // may be null: no key needed; else outlives the service
};

// Takes one response message; false when the client went away (the request
// stops, its KV freed).
using ResponseWriter = std::function<bool(const v1::GenerateResponse&)>;

class GenerationService final
    : public v1::Generation::WithCallbackMethod_Generate<v1::Generation::Service> {
 public:
  // `codec` may be null (no tokenizer: text prompts are refused).
  GenerationService(const ModelConfig& config, GenerationBackend* backend, const TextCodec* codec,
                    GenerationServiceOptions options);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) override;
  grpc::Status Tokenize(grpc::ServerContext*, const v1::TokenizeRequest*,
                        v1::TokenizeResponse*) override;
  grpc::Status Detokenize(grpc::ServerContext*, const v1::DetokenizeRequest*,
                          v1::DetokenizeResponse*) override;
  grpc::Status ModelInfo(grpc::ServerContext*, const v1::ModelInfoRequest*,
                         v1::ModelInfoResponse*) override;
  grpc::Status Abort(grpc::ServerContext*, const v1::AbortRequest*, v1::AbortResponse*) override;

  // A validated request, or INVALID_ARGUMENT explaining what is wrong (what
  // Generate checks first; the fuzz target tests/fuzz/request_fuzzer.cc).
  absl::StatusOr<GenerationRequest> Validate(const v1::GenerateRequest& r) const;

  // Runs `request` on the calling thread as Generate does (validation,
  // limits, stop strings, detokenizing, metrics, Abort by id, drain), handing
  // each message to `write` in order, the last with `final` set. OK once the
  // final message was written; otherwise the request's error (absl codes
  // that map onto gRPC's; no message was written for a refused request).
  // Callers check API keys themselves.
  absl::Status Serve(const v1::GenerateRequest& request, const ResponseWriter& write);

  // Prompt + output limit, resolved.
  int max_context_tokens() const { return max_context_; }
  // The most new tokens a request may ask for.
  int max_new_tokens_limit() const { return options_.max_new_tokens_limit; }
  // Requests running now.
  int num_running() const;
  // Graceful shutdown: from now on Generate answers UNAVAILABLE (a client
  // retries on another router); the requests running go on to their end.
  void Drain();

 private:
  // A request's cancellation: its client went away, or Abort.
  struct Control {
    std::atomic<bool> aborted{false};
    CancelToken cancel;
  };
  using Stream = BlockingWriteReactor<v1::GenerateResponse>;
  // Runs one request to its status (Serve, and Generate on a pool thread).
  // `past_deadline` (may be null) tells a cancellation by the client's
  // deadline from others.
  absl::Status Execute(const v1::GenerateRequest& request, const ResponseWriter& write,
                       const std::shared_ptr<Control>& control,
                       const std::function<bool()>& past_deadline);
  // One sibling (choice `index`) of request `r`, validated as `b`: runs it on
  // the backend and writes its messages, its final last, through `write`
  // (shared by the siblings). Its status; *reason: its finish reason.
  absl::Status RunChoice(const v1::GenerateRequest& r, const GenerationRequest& b, int index,
                         std::chrono::steady_clock::time_point arrival, const ResponseWriter& write,
                         Control& control, const std::atomic<bool>* client_gone,
                         v1::FinishReason* reason);
  // OK without api_keys, else the check of the call's `authorization`.
  absl::Status CheckKey(const grpc::ServerContextBase& ctx) const;

  const ModelConfig config_;
  GenerationBackend* const backend_;
  const TextCodec* const codec_;
  const GenerationServiceOptions options_;
  const int max_context_;
  // "req-<48 random bits>-": the ids this router gives requests without one
  // differ from every other router's (router HA: the workers key requests by id).
  const std::string id_prefix_;
  // Null without metrics.
  prometheus::Histogram* ttft_ = nullptr;
  prometheus::Histogram* itl_ = nullptr;
  prometheus::Histogram* e2e_ = nullptr;
  prometheus::Gauge* running_gauge_ = nullptr;
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* generation_tokens_ = nullptr;
  prometheus::Family<prometheus::Counter>* success_ = nullptr;  // by finish_reason
  prometheus::Family<prometheus::Counter>* failure_ = nullptr;  // by gRPC code
  absl::Status Fail(absl::Status s);

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Control>> running_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  ThreadPool pool_;  // last: its threads finish before the members above go
};

}  // namespace moesh

#endif  // MOESH_ROUTER_GENERATION_SERVICE_H_
