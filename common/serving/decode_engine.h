// The decode worker's core: a paged KV cache and a continuous-batching loop
// that advances every running request by one token per step, with one expert
// dispatch per MoE layer for the whole batch.
//
// Request life: Reserve (blocks allocated) → PushKv (rows arrive from the
// prefill worker) → Decode (joins the running batch; tokens stream to the
// caller) → finished, cancelled or failed, which frees the blocks. A
// reservation that never starts decoding is freed after `reservation_lease`.
//
// Thread-safe. Owns one engine thread.
#ifndef MOESH_COMMON_SERVING_DECODE_ENGINE_H_
#define MOESH_COMMON_SERVING_DECODE_ENGINE_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/attention_backend.h"
#include "common/engine/sampler.h"
#include "common/metrics/metrics.h"
#include "common/serving/generation_flow.h"
#include "common/serving/serving_load.h"
#include "common/transport/transport.h"

namespace moesh {

struct DecodeEngineOptions {
  int max_batch = 256;  // running requests per step
  // Ping-pong micro-batches per step when the experts are remote (1: off),
  // used once a step has at least micro_batch_min requests (smaller halves
  // hide nothing; BENCHMARKS.md).
  int micro_batches = 2;
  int micro_batch_min = 16;
  std::chrono::milliseconds reservation_lease{30000};
  Metrics* metrics = nullptr;  // may be null
};

// Receives a request's output, in order, on Decode's calling thread (so it
// may block, e.g. on a slow client's flow control, without stalling the batch).
using DecodeSink = std::function<void(const TokenEvent&)>;

class DecodeEngine : public KvHandler {
 public:
  // `backend` (its KV pool holds the requests' caches) and `experts` are
  // borrowed and must outlive the engine; `experts` is null iff
  // backend->has_experts().
  DecodeEngine(AttentionBackend* backend, ExpertClient* experts, DecodeEngineOptions options);
  ~DecodeEngine() override;  // fails running requests with UNAVAILABLE, joins the thread

  // RESOURCE_EXHAUSTED if the blocks are not free; ALREADY_EXISTS for a
  // duplicate id.
  absl::Status Reserve(const std::string& request_id, int max_tokens);
  // KvHandler: the prefilled rows of a reserved request.
  absl::Status PushKv(const KvTransfer& transfer) override;
  absl::Status Release(const std::string& request_id);

  // Runs the request to completion, calling `sink` with each step's output
  // (the last one has finished = true). Returns when done; CANCELLED once
  // `cancel` fired (woken by it, not polled: the request leaves the batch at
  // the next step boundary and its blocks are freed), UNAVAILABLE if an
  // expert failed. `sink` runs with no engine lock held, so it may cancel.
  // REQUIRES: Reserve and PushKv for spec.request_id succeeded.
  absl::Status Decode(const DecodeSpec& spec, const DecodeSink& sink, const CancelToken& cancel);

  ServingLoad Load() const;

 private:
  struct Request {
    DecodeSpec spec;
    // Shared with a KV handoff in progress, which keeps it alive if the
    // request ends meanwhile (its lease expires, it is cancelled).
    std::shared_ptr<KvSequence> kv;
    std::unique_ptr<Sampler> sampler;
    std::vector<int32_t> output;  // generated so far, first_token included
    std::chrono::steady_clock::time_point reserved_at;
    bool kv_received = false;
    bool running = false;  // in the batch loop
    bool cancelled = false;
    bool done = false;
    absl::Status status;
    std::deque<TokenEvent> outbox;  // produced by the engine, drained by Decode
  };

  void Loop();
  // One step over `batch`; returns false if the forward failed (all failed).
  void Step(const std::vector<std::shared_ptr<Request>>& batch);
  void ExpireReservations() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `r` with `status`, dropping it from the table (its blocks are freed
  // when the last reference goes).
  void Finish(std::shared_ptr<Request> r, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  AttentionBackend* const backend_;
  ExpertClient* const experts_;
  const DecodeEngineOptions options_;

  // Null without metrics.
  prometheus::Gauge* kv_usage_ = nullptr;
  prometheus::Gauge* kv_free_blocks_ = nullptr;
  prometheus::Gauge* running_ = nullptr;
  prometheus::Counter* tokens_ = nullptr;
  prometheus::Histogram* step_seconds_ = nullptr;
  prometheus::Histogram* batch_size_ = nullptr;
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::atomic<bool> logged_device_kv_{false};  // the first device-to-device KV handoff is logged
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Request>> requests_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_SERVING_DECODE_ENGINE_H_
