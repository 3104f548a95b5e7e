// The decode worker's core: a paged KV cache and a continuous-batching loop
// that advances every running request by one token per step, with one expert
// dispatch per MoE layer for the whole batch.
//
// Request life: Reserve (blocks allocated) → PushKv (the prompt's rows and
// first token arrive from the prefill worker; the request joins the running
// batch) → finished, cancelled or failed, which frees the blocks. Decode
// streams a request's events to its caller from the first token on. A
// reservation whose KV does not arrive within `reservation_lease` is freed.
//
// Thread-safe. Owns one engine thread.
#ifndef MOESH_COMMON_SERVING_DECODE_ENGINE_H_
#define MOESH_COMMON_SERVING_DECODE_ENGINE_H_

#include <atomic>
#include <chrono>
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
  // The share of the KV pool, (0, 1], that one caller's reservations still
  // waiting for their KV may hold together (a caller with none pending may
  // always reserve one): a flood of reservations from one peer leaves the
  // rest of the pool to others. 1: no cap.
  double max_pending_kv_share = 1.0;
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

  // A request of this engine, from its reservation on (opaque to callers).
  struct Request;

  // Holds blocks for spec.max_tokens() tokens of a new request, which then
  // waits for its KV. RESOURCE_EXHAUSTED if the blocks are not free, or if
  // `caller` (a peer's host; empty: not counted) would hold more than
  // max_pending_kv_share of the pool in reservations awaiting their KV;
  // ALREADY_EXISTS for a duplicate id; INVALID_ARGUMENT for bad sampling or
  // sizes.
  absl::StatusOr<std::shared_ptr<Request>> Reserve(const DecodeSpec& spec,
                                                   const std::string& caller = "");
  // KvHandler: a reserved request's prefilled rows and first token. The
  // request joins the running batch, or ends at once if the first token
  // ends it (a stop id, max_new_tokens 1). INVALID_ARGUMENT for a first
  // token outside the vocabulary.
  absl::Status PushKv(const KvTransfer& transfer) override;
  // Ends a request nobody decodes (its blocks are freed); nothing if it ended.
  void Release(const std::shared_ptr<Request>& request);

  // Streams a reserved request's events to `sink` (the first token once its
  // KV arrived, then one per step; the last has finished = true) and returns
  // when it ended: OK when it finished; CANCELLED once `cancel` fired (woken
  // by it, not polled: the request leaves the batch at the next step boundary
  // and its blocks are freed); DEADLINE_EXCEEDED if the KV did not arrive
  // within the lease; UNAVAILABLE if an expert failed; ALREADY_EXISTS if
  // another call streams it. `sink` runs with no engine
  // lock held, so it may cancel.
  absl::Status Decode(const std::shared_ptr<Request>& request, const DecodeSink& sink,
                      const CancelToken& cancel);

  // Graceful shutdown: from now on Reserve answers UNAVAILABLE; what is
  // reserved or running finishes (Load().in_flight counts it down).
  void Drain();

  ServingLoad Load() const;

 private:
  void Loop();
  // One step over `batch`; returns false if the forward failed (all failed).
  void Step(const std::vector<std::shared_ptr<Request>>& batch);
  void ExpireReservations() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `r` with `status`, dropping it from the table (its blocks are freed
  // when the last reference goes).
  void Finish(std::shared_ptr<Request> r, absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends `r` with `why` if it waits for its KV; marks it for the loop to drop
  // if it runs. Nothing if it ended.
  void Cancel(std::shared_ptr<Request> r, absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `r` no longer waits for its KV: its blocks leave its caller's pending count.
  void EndPending(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int kv_arriving_ ABSL_GUARDED_BY(mu_) = 0;  // PushKv calls storing rows now
  // Caller -> blocks its reservations awaiting their KV hold (no zero entries).
  std::map<std::string, int> pending_blocks_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_SERVING_DECODE_ENGINE_H_
