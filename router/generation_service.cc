#include "router/generation_service.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/random_id.h"
#include "base/status.h"
#include "common/rpc/grpc_util.h"
#include "common/service/sampling_proto.h"
#include "common/transport/token_wire.h"

namespace moesh {
namespace {

std::string RequestIdPrefix() {
  absl::StatusOr<std::string> r = RandomHexId(6);
  return absl::StrCat("req-", r.ok() ? *r : std::to_string(getpid()), "-");
}

// A text prompt longer than this many bytes per token of the context limit
// cannot fit it (tokenizers' tokens average ~4 bytes; 16 leaves room for
// long merges and multi-byte scripts): refused before tokenizing, which
// costs time and memory in proportion to the bytes.
constexpr int64_t kMaxPromptBytesPerToken = 16;
// Every generated piece is matched against every stop string, and every token
// against every stop id: a request may not make that cost unbounded.
constexpr int kMaxStopStrings = 16;
constexpr size_t kMaxStopStringBytes = 256;
constexpr int kMaxStopTokenIds = 1024;

// A text's byte length against the context limit, before it is tokenized.
absl::Status CheckTextBytes(absl::string_view field, absl::string_view text, int max_context) {
  const int64_t limit = kMaxPromptBytesPerToken * max_context;
  if (static_cast<int64_t>(text.size()) > limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is ", text.size(), " bytes; the limit is ", limit, " (", kMaxPromptBytesPerToken,
        " bytes per token of the ", max_context, "-token context)"));
  }
  return absl::OkStatus();
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// Holds back text that might be the start of a stop string; finds matches.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}
  // Appends `delta`; returns the text now safe to emit. Sets *matched when a
  // stop string appeared (the text before it is returned, the rest dropped).
  std::string Push(const std::string& delta, std::string* matched) {
    text_ += delta;
    size_t cut = std::string::npos;
    for (const std::string& s : stops_) {
      const size_t at = text_.find(s, std::max<size_t>(sent_, s.size()) - s.size());
      if (at != std::string::npos && at < cut) {
        cut = at;
        *matched = s;
      }
    }
    if (cut != std::string::npos) return Emit(std::max(cut, sent_));
    size_t hold = 0;  // longest suffix that is a proper prefix of a stop string
    for (const std::string& s : stops_) {
      for (size_t k = std::min(s.size() - 1, text_.size() - sent_); k > hold; --k) {
        if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
    return Emit(text_.size() - hold);
  }
  std::string Flush() { return Emit(text_.size()); }

 private:
  std::string Emit(size_t upto) {
    std::string out = text_.substr(sent_, upto - sent_);
    sent_ = upto;
    return out;
  }
  const std::vector<std::string> stops_;
  std::string text_;
  size_t sent_ = 0;
};

}  // namespace

GenerationService::GenerationService(const ModelConfig& config, GenerationBackend* backend,
                                     const TextCodec* codec, GenerationServiceOptions options)
    : config_(config),
      backend_(backend),
      codec_(codec),
      options_(options),
      max_context_(options.max_context_tokens > 0       ? options.max_context_tokens
                   : config.max_position_embeddings > 0 ? config.max_position_embeddings
                                                        : 4096),
      id_prefix_(RequestIdPrefix()) {
  if (Metrics* m = options.metrics) {
    ttft_ = &m->HistogramFamily("moesh_time_to_first_token_seconds",
                                "Request arrival to its first token.")
                 .Add({}, Metrics::LatencyBuckets());
    itl_ = &m->HistogramFamily("moesh_inter_token_latency_seconds",
                               "Time between consecutive tokens of a stream.")
                .Add({}, Metrics::LatencyBuckets());
    e2e_ = &m->HistogramFamily("moesh_e2e_request_latency_seconds",
                               "Request arrival to its last token.")
                .Add({}, Metrics::LatencyBuckets());
    running_gauge_ =
        &m->GaugeFamily("moesh_num_requests_running", "Requests being generated.").Add({});
    prompt_tokens_ =
        &m->CounterFamily("moesh_prompt_tokens_total", "Prompt tokens of admitted requests.")
             .Add({});
    generation_tokens_ =
        &m->CounterFamily("moesh_generation_tokens_total", "Tokens streamed to clients.").Add({});
    success_ = &m->CounterFamily("moesh_request_success_total",
                                 "Requests that finished, by finish reason.");
    failure_ = &m->CounterFamily("moesh_request_failure_total",
                                 "Requests that ended with an error, by gRPC code.");
  }
}

absl::Status GenerationService::Fail(absl::Status s) {
  // absl's codes are gRPC's numbers.
  if (failure_ != nullptr)
    failure_->Add({{"code", std::to_string(static_cast<int>(s.code()))}}).Increment();
  return s;
}

absl::Status GenerationService::CheckKey(const grpc::ServerContextBase& ctx) const {
  if (options_.api_keys == nullptr) return absl::OkStatus();
  const auto& md = ctx.client_metadata();
  auto it = md.find("authorization");
  return options_.api_keys->Check(it == md.end()
                                      ? absl::string_view()
                                      : absl::string_view(it->second.data(), it->second.size()));
}

absl::StatusOr<GenerationRequest> GenerationService::Validate(const v1::GenerateRequest& r) const {
  GenerationRequest b;
  RETURN_IF_ERROR(CheckRequestId(r.request_id(), /*allow_empty=*/true));  // empty: one is made
  switch (r.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (codec_ == nullptr) {
        return absl::InvalidArgumentError(
            "the model has no tokenizer.json: send token_ids instead of text");
      }
      if (absl::Status s = CheckTextBytes("the prompt text", r.text(), max_context_); !s.ok()) {
        return s;
      }
      absl::StatusOr<std::vector<int32_t>> ids =
          codec_->Encode(r.text(), !r.has_add_special_tokens() || r.add_special_tokens());
      if (!ids.ok())
        return absl::InvalidArgumentError(absl::StrCat("prompt text: ", ids.status().message()));
      b.prompt = std::move(*ids);
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      b.prompt.assign(r.token_ids().ids().begin(), r.token_ids().ids().end());
      break;
    case v1::GenerateRequest::PROMPT_NOT_SET:
      return absl::InvalidArgumentError("the request has no prompt (set text or token_ids)");
  }
  if (b.prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (int32_t t : b.prompt) {
    if (t < 0 || t >= config_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt token id ", t, " is outside the vocabulary [0, ", config_.vocab_size, ")"));
    }
  }
  const int prompt_len = static_cast<int>(b.prompt.size());
  if (prompt_len >= max_context_) {
    return absl::InvalidArgumentError(absl::StrCat("the prompt has ", prompt_len,
                                                   " tokens; the context limit is ", max_context_,
                                                   " (prompt + output)"));
  }
  b.sampling = SamplingFromProto(r.sampling());
  if (absl::Status s = b.sampling.ValidateServed(config_.vocab_size); !s.ok()) return s;
  if (r.n() < 0 || r.n() > kMaxChoices) {
    return absl::InvalidArgumentError(
        absl::StrCat("n must lie in [1, ", kMaxChoices, "], got ", r.n()));
  }
  if (r.n() > 1 && r.request_id().size() + 3 > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id: with n > 1 at most ",
                                                   kMaxRequestIdBytes - 3,
                                                   " bytes (\"#<index>\" is added)"));
  }
  const v1::StopConditions& stop = r.stop();
  if (stop.has_max_new_tokens()) {
    if (stop.max_new_tokens() < 1 || stop.max_new_tokens() > options_.max_new_tokens_limit) {
      return absl::InvalidArgumentError(absl::StrCat("max_new_tokens must lie in [1, ",
                                                     options_.max_new_tokens_limit, "], got ",
                                                     stop.max_new_tokens()));
    }
    if (prompt_len + stop.max_new_tokens() > max_context_) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt (", prompt_len, " tokens) + max_new_tokens (", stop.max_new_tokens(),
                       ") exceeds the context limit of ", max_context_));
    }
    b.max_new_tokens = stop.max_new_tokens();
  } else {
    b.max_new_tokens = std::min(options_.default_max_new_tokens, max_context_ - prompt_len);
  }
  if (stop.stop_token_ids_size() > kMaxStopTokenIds) {
    return absl::InvalidArgumentError(absl::StrCat("stop_token_ids: ", stop.stop_token_ids_size(),
                                                   " ids; at most ", kMaxStopTokenIds));
  }
  for (int32_t t : stop.stop_token_ids()) {
    if (t < 0 || t >= config_.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop token id ", t, " is outside the vocabulary"));
    }
    b.stop_token_ids.push_back(t);
  }
  if (!stop.ignore_eos())
    b.stop_token_ids.insert(b.stop_token_ids.end(), config_.eos_token_ids.begin(),
                            config_.eos_token_ids.end());
  if (stop.stop_strings_size() > kMaxStopStrings) {
    return absl::InvalidArgumentError(absl::StrCat("stop_strings: ", stop.stop_strings_size(),
                                                   " strings; at most ", kMaxStopStrings));
  }
  for (const std::string& s : stop.stop_strings()) {
    if (s.empty()) return absl::InvalidArgumentError("stop strings must not be empty");
    if (s.size() > kMaxStopStringBytes) {
      return absl::InvalidArgumentError(absl::StrCat("stop_strings: a string of ", s.size(),
                                                     " bytes; at most ", kMaxStopStringBytes));
    }
    if (codec_ == nullptr)
      return absl::InvalidArgumentError("stop strings need the model's tokenizer.json");
  }
  if (r.has_detokenize() && r.detokenize() && codec_ == nullptr) {
    return absl::InvalidArgumentError("detokenize needs the model's tokenizer.json");
  }
  b.priority = r.priority();
  return b;
}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* ctx, const v1::GenerateRequest* request) {
  auto control = std::make_shared<Control>();
  // The client going away (cancel, deadline) fires the request's CancelToken.
  auto* stream = new Stream([control] { control->cancel.Cancel(); });
  pool_.Schedule([this, ctx, request, stream, control] {
    absl::Status s = CheckKey(*ctx);
    if (s.ok()) {
      s = Execute(
          *request, [stream](const v1::GenerateResponse& m) { return stream->Write(m); }, control,
          [ctx] {
            return ctx->IsCancelled() && std::chrono::system_clock::now() >= ctx->deadline();
          });
    }
    stream->Finish(ToGrpcStatus(s));
  });
  return stream;
}

absl::Status GenerationService::Serve(const v1::GenerateRequest& request,
                                      const ResponseWriter& write) {
  return Execute(request, write, std::make_shared<Control>(), nullptr);
}

absl::Status GenerationService::Execute(const v1::GenerateRequest& r, const ResponseWriter& write,
                                        const std::shared_ptr<Control>& control,
                                        const std::function<bool()>& past_deadline) {
  const auto arrival = std::chrono::steady_clock::now();
  absl::StatusOr<GenerationRequest> b = Validate(r);
  if (!b.ok()) return Fail(b.status());
  const std::atomic<bool>* const aborted = &control->aborted;
  {
    absl::MutexLock lock(&mu_);
    if (draining_) {
      return Fail(absl::UnavailableError(
          "the router is draining (shutting down): retry on another router"));
    }
    b->request_id = r.request_id().empty() ? absl::StrCat(id_prefix_, ++next_id_) : r.request_id();
    if (!running_.emplace(b->request_id, control).second) {
      return Fail(absl::AlreadyExistsError(absl::StrCat("request ", b->request_id, " is running")));
    }
    if (running_gauge_ != nullptr) running_gauge_->Set(static_cast<double>(running_.size()));
  }
  if (prompt_tokens_ != nullptr) prompt_tokens_->Increment(static_cast<double>(b->prompt.size()));
  // n siblings: each its own backend request; their messages go out one at a
  // time through `write`. Sibling 0 runs first; the others start once it has
  // streamed its first message (its prompt prefilled, the prompt's full
  // blocks published to the prefix cache) or ended, so they take the prompt's
  // KV from the cache (KV-aware routing sends them to the worker holding it)
  // and compute only its last partial block.
  const int n = std::max(r.n(), 1);
  absl::Mutex write_mu;
  std::atomic<bool> client_gone{false};
  const ResponseWriter locked_write = [&](const v1::GenerateResponse& m) {
    absl::MutexLock lock(&write_mu);
    if (client_gone.load()) return false;
    if (!write(m)) client_gone = true;
    return !client_gone.load();
  };
  std::vector<absl::Status> status(n);
  std::vector<v1::FinishReason> reasons(n, v1::FINISH_REASON_UNSPECIFIED);
  absl::Notification first_streamed;  // sibling 0's first message, or its end
  const ResponseWriter first_write = [&](const v1::GenerateResponse& m) {
    const bool ok = locked_write(m);
    if (!first_streamed.HasBeenNotified()) first_streamed.Notify();
    return ok;
  };
  auto sibling = [&](int i) {
    GenerationRequest req = *b;
    if (n > 1) {
      req.request_id = absl::StrCat(b->request_id, "#", i);
      if (req.sampling.seed.has_value()) *req.sampling.seed += static_cast<uint64_t>(i);
    }
    if (i > 0) first_streamed.WaitForNotification();
    status[i] = RunChoice(r, req, i, arrival, i == 0 ? first_write : locked_write, *control,
                          &client_gone, &reasons[i]);
    if (i == 0 && !first_streamed.HasBeenNotified()) first_streamed.Notify();
    // A failed sibling ends the request: the others stop too.
    if (!status[i].ok() && status[i].code() != absl::StatusCode::kCancelled)
      control->cancel.Cancel();
  };
  if (n == 1) {
    sibling(0);
  } else {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) threads.emplace_back(sibling, i);
    for (std::thread& t : threads) t.join();
  }
  {
    absl::MutexLock lock(&mu_);
    running_.erase(b->request_id);
    if (running_gauge_ != nullptr) running_gauge_->Set(static_cast<double>(running_.size()));
  }
  // The first real error; a cancellation only when every sibling's was one.
  absl::Status s;
  for (const absl::Status& si : status) {
    if (!si.ok() && (s.ok() || s.code() == absl::StatusCode::kCancelled)) s = si;
  }
  if (!s.ok() && !(s.code() == absl::StatusCode::kCancelled && aborted->load())) {
    if (past_deadline && past_deadline()) {
      return Fail(absl::DeadlineExceededError("deadline exceeded"));
    }
    return Fail(s);
  }
  if (client_gone.load()) {  // its stream stopped at the failed write; nobody reads an answer
    return Fail(absl::CancelledError("the client went away"));
  }
  if (success_ != nullptr) {
    success_
        ->Add({{"finish_reason",
                absl::AsciiStrToLower(v1::FinishReason_Name(reasons[0]).substr(14))}})
        .Increment();
    e2e_->Observe(SecondsSince(arrival));
  }
  return absl::OkStatus();
}

absl::Status GenerationService::RunChoice(const v1::GenerateRequest& r, const GenerationRequest& b,
                                          int index, std::chrono::steady_clock::time_point arrival,
                                          const ResponseWriter& write, Control& control,
                                          const std::atomic<bool>* client_gone,
                                          v1::FinishReason* reason) {
  const std::atomic<bool>* const aborted = &control.aborted;
  // The client's id (the workers' is "<id>#<index>" when n > 1).
  const std::string id = r.n() > 1 ? b.request_id.substr(0, b.request_id.rfind('#')) : b.request_id;
  auto last_token_time = arrival;
  const bool detok =
      codec_ != nullptr &&
      (r.has_detokenize() ? r.detokenize() : r.prompt_case() == v1::GenerateRequest::kText);
  std::unique_ptr<TextStream> text = detok ? codec_->NewStream() : nullptr;
  StopStringMatcher stops({r.stop().stop_strings().begin(), r.stop().stop_strings().end()});
  const bool has_stop_strings = r.stop().stop_strings_size() > 0;
  int completion = 0;
  double ttft = -1, queue_seconds = 0;
  int cached_tokens = 0;
  bool stopped = false, gone = false;
  std::string matched;
  int32_t last_token = -1;
  ChunkSink sink = [&](const TokenChunk& chunk) {
    const auto now = std::chrono::steady_clock::now();
    if (ttft < 0) {
      ttft = SecondsSince(arrival);
      queue_seconds = chunk.queue_seconds;
      cached_tokens = chunk.cached_tokens;
      if (ttft_ != nullptr && index == 0) ttft_->Observe(ttft);
    } else if (itl_ != nullptr) {
      itl_->Observe(std::chrono::duration<double>(now - last_token_time).count() /
                    std::max<size_t>(chunk.ids.size(), 1));
    }
    last_token_time = now;
    if (generation_tokens_ != nullptr)
      generation_tokens_->Increment(static_cast<double>(chunk.ids.size()));
    v1::GenerateResponse m;
    m.set_request_id(id);
    m.set_index(index);
    if (chunk.prompt_logprobs.has_value()) {
      PromptLogprobsToProto(*chunk.prompt_logprobs, m.mutable_prompt_logprobs());
      m.mutable_prompt_logprobs()->mutable_token_ids()->Add(b.prompt.begin(), b.prompt.end());
    }
    std::string delta;
    for (size_t i = 0; i < chunk.ids.size() && !stopped; ++i) {
      m.add_token_ids(chunk.ids[i]);
      if (i < chunk.logprobs.size()) LogprobsToProto(chunk.logprobs[i], m.add_logprobs());
      if (i < chunk.token_logprobs.size()) m.add_token_logprobs(chunk.token_logprobs[i]);
      ++completion;
      last_token = chunk.ids[i];
      if (text != nullptr || has_stop_strings) {
        std::string piece = text != nullptr ? text->Push(chunk.ids[i]) : std::string();
        delta += has_stop_strings ? stops.Push(piece, &matched) : piece;
        if (!matched.empty()) stopped = true;
      }
    }
    m.set_text(delta);
    if (!write(m)) gone = true;
    return !stopped && !gone;
  };
  absl::Status s = backend_->Run(b, sink, control.cancel);
  if (!s.ok() && !(s.code() == absl::StatusCode::kCancelled && aborted->load())) return s;
  if (gone || client_gone->load()) return absl::CancelledError("the client went away");
  v1::GenerateResponse last;
  last.set_request_id(id);
  last.set_index(index);
  if (!stopped && text != nullptr) {
    std::string tail = text->Flush();
    last.set_text(has_stop_strings ? stops.Push(tail, &matched) + stops.Flush() : tail);
  }
  v1::FinalInfo* fin = last.mutable_final();
  const bool stop_id = std::find(b.stop_token_ids.begin(), b.stop_token_ids.end(), last_token) !=
                       b.stop_token_ids.end();
  if (aborted->load() && s.code() == absl::StatusCode::kCancelled) {
    fin->set_finish_reason(v1::FINISH_REASON_ABORT);
  } else if (stopped || !matched.empty()) {
    fin->set_finish_reason(v1::FINISH_REASON_STOP);
    fin->set_matched_stop(matched);
  } else if (stop_id) {
    fin->set_finish_reason(v1::FINISH_REASON_STOP);
    if (codec_ != nullptr) fin->set_matched_stop(codec_->Decode({last_token}, false));
  } else {
    fin->set_finish_reason(v1::FINISH_REASON_LENGTH);
  }
  // The prompt counts once: on sibling 0's final.
  fin->mutable_usage()->set_prompt_tokens(index == 0 ? static_cast<int>(b.prompt.size()) : 0);
  fin->mutable_usage()->set_completion_tokens(completion);
  fin->mutable_usage()->set_cached_tokens(index == 0 ? cached_tokens : 0);
  fin->mutable_timings()->set_time_to_first_token_seconds(std::max(ttft, 0.0));
  fin->mutable_timings()->set_queue_seconds(queue_seconds);
  fin->mutable_timings()->set_total_seconds(SecondsSince(arrival));
  *reason = fin->finish_reason();
  write(last);  // a client gone now misses only the end (the other siblings stop at their next)
  return absl::OkStatus();
}

grpc::Status GenerationService::Tokenize(grpc::ServerContext* ctx,
                                         const v1::TokenizeRequest* request,
                                         v1::TokenizeResponse* response) {
  if (absl::Status s = CheckKey(*ctx); !s.ok()) return ToGrpcStatus(s);
  if (codec_ == nullptr)
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the model has no tokenizer.json");
  if (absl::Status s = CheckTextBytes("text", request->text(), max_context_); !s.ok()) {
    return ToGrpcStatus(s);
  }
  absl::StatusOr<std::vector<int32_t>> ids =
      codec_->Encode(request->text(), request->add_special_tokens());
  if (!ids.ok()) return ToGrpcStatus(ids.status());
  response->mutable_token_ids()->Add(ids->begin(), ids->end());
  return grpc::Status::OK;
}

grpc::Status GenerationService::Detokenize(grpc::ServerContext* ctx,
                                           const v1::DetokenizeRequest* request,
                                           v1::DetokenizeResponse* response) {
  if (absl::Status s = CheckKey(*ctx); !s.ok()) return ToGrpcStatus(s);
  if (codec_ == nullptr)
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "the model has no tokenizer.json");
  for (int32_t t : request->token_ids()) {
    if (t < 0 || t >= config_.vocab_size) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("token id ", t, " is outside the vocabulary"));
    }
  }
  std::vector<int32_t> ids(request->token_ids().begin(), request->token_ids().end());
  response->set_text(codec_->Decode(ids, request->skip_special_tokens()));
  return grpc::Status::OK;
}

grpc::Status GenerationService::ModelInfo(grpc::ServerContext* ctx, const v1::ModelInfoRequest*,
                                          v1::ModelInfoResponse* response) {
  if (absl::Status s = CheckKey(*ctx); !s.ok()) return ToGrpcStatus(s);
  response->set_model_type(config_.model_type);
  response->set_vocab_size(config_.vocab_size);
  response->set_max_context_tokens(max_context_);
  response->set_max_new_tokens_limit(options_.max_new_tokens_limit);
  response->set_num_layers(config_.num_hidden_layers);
  response->set_num_routed_experts(config_.n_routed_experts);
  response->set_num_experts_per_token(config_.num_experts_per_tok);
  response->mutable_eos_token_ids()->Add(config_.eos_token_ids.begin(),
                                         config_.eos_token_ids.end());
  response->set_has_tokenizer(codec_ != nullptr);
  return grpc::Status::OK;
}

grpc::Status GenerationService::Abort(grpc::ServerContext* ctx, const v1::AbortRequest* request,
                                      v1::AbortResponse* response) {
  if (absl::Status s = CheckKey(*ctx); !s.ok()) return ToGrpcStatus(s);
  std::shared_ptr<Control> control;
  {
    absl::MutexLock lock(&mu_);
    auto it = running_.find(request->request_id());
    if (it != running_.end()) control = it->second;
  }
  response->set_found(control != nullptr);
  if (control != nullptr) {
    control->aborted = true;
    control->cancel.Cancel();  // outside mu_: its callbacks cancel the worker calls
  }
  return grpc::Status::OK;
}

int GenerationService::num_running() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(running_.size());
}

void GenerationService::Drain() {
  absl::MutexLock lock(&mu_);
  draining_ = true;
}

}  // namespace moesh
