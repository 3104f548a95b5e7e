// The decode worker's core: a paged KV cache and a continuous-batching loop
// that advances every running request by one token per step, with one expert
// dispatch per MoE layer for the whole batch.
//
// Request life: Reserve (queued until the blocks of its prompt are free, then
// admitted: those blocks allocated) → PushKv (the prompt's rows and first
// token arrive from the prefill worker; the request joins the running batch)
// → finished, cancelled or failed, which frees the blocks. Decode streams a
// request's events to its caller from the first token on. A reservation whose
// KV does not arrive within `reservation_lease` (counted from admission) is
// freed.
//
// KV blocks are taken as tokens are produced: each step first gives every
// request in the batch room for its next token. When the pool runs dry, the
// running request with the highest priority value (the latest arrival among
// equals; it may be the one growing) is preempted: its blocks are freed and
// it goes back to the queue. By recompute (PreemptionMode::kRecompute):
// resumed, it runs prompt + output through the model in one pass, or in
// chunks (below), rebuilding its KV, and samples its next token from the
// last. By swap (kSwap): its rows are first copied into host memory the
// request owns (SerializeKv, the host KV handoff's form: float32, or bf16
// from a device pool, exactly; every family's whole cache row, so V3.2's
// index keys, and V4's rows whose compressed entries are recomputed from
// them), counted against swap_space_bytes; resumed, a new sequence takes
// them back (DeserializeKv, skipping what the prefix cache holds again) and
// it decodes on, computing nothing twice. A swap that would pass
// swap_space_bytes, or whose copy fails, recomputes instead (counted and
// logged). Either way its stream goes on with no gap or repeat. The queue
// is ordered by (priority, arrival): lower priority values first, first come
// first served within one.
//
// Chunked prefill (max_num_batched_tokens > 0): a step carries the running
// decodes first (one token each) and fills what the budget leaves with
// prompt chunks: of resumed requests (prompt + output recomputed) and of
// requests that compute their prompt here (DecodeSpec::compute_prompt, the
// colocated router: no prefill worker, no KV handoff), by priority and then
// round robin (the least recently served first, so a short prompt behind a
// long one gets the next step instead of waiting for all its chunks). A
// chunk appends its tokens to the request's sequence; the step that computes
// the last chunk samples the request's next token (a first token carries the queue time,
// cached tokens and prompt log-probabilities a prefill worker's would); the
// logits of earlier chunks are not used, except for prompt log-probabilities:
// each chunk scores the tokens after each of its positions (its last, the
// next chunk's first), joined over the chunks into the whole prompt's. A
// request computing its prompt for them reads no rows from the prefix cache
// (every position's logits are needed; cached_tokens is 0), its blocks join it.
//
// Prefix cache (where the backend keeps one: common/engine/paged_kv_cache.h):
// an admitted request's sequence starts with the cached blocks of its prompt
// (a resumed one's: of prompt + output, recomputing only the rest), the KV
// handoff stores only the rows past them, and every block a request fills is
// published for later requests (a chat's next turn reuses this one's prompt
// and output). Preemption only drops the request's references: its published
// blocks stay cached until the pool needs them (a swapped request's resume
// takes those still cached from the cache, the rest from its host copy).
//
// Thread-safe. Owns one engine thread.
#ifndef MOESH_COMMON_SERVING_DECODE_ENGINE_H_
#define MOESH_COMMON_SERVING_DECODE_ENGINE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/engine/attention_backend.h"
#include "common/engine/sampler.h"
#include "common/metrics/metrics.h"
#include "common/serving/generation_flow.h"
#include "common/serving/prefix_cache_metrics.h"
#include "common/serving/serving_load.h"
#include "common/transport/transport.h"

namespace moesh {

// How a preempted request resumes (header comment).
enum class PreemptionMode { kRecompute, kSwap };
// "recompute" or "swap"; INVALID_ARGUMENT otherwise.
absl::StatusOr<PreemptionMode> ParsePreemptionMode(absl::string_view name);

struct DecodeEngineOptions {
  int max_batch = 256;  // running requests per step
  // Tokens one step computes: decode tokens first, prompt chunks in the rest
  // (header comment). 0: no budget, a prompt or a recompute runs whole.
  int max_num_batched_tokens = 0;
  // New requests queued for admission beyond which Reserve answers
  // RESOURCE_EXHAUSTED (preempted ones are not counted: they were admitted).
  int max_waiting = 1024;
  // The prefill engine takes its blocks from the same pool (colocated): a new
  // request is admitted only with room for its prefill pass besides its own.
  bool prefill_shares_pool = false;
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
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
  // kSwap: host bytes the swapped requests' rows may hold together.
  int64_t swap_space_bytes = int64_t{4} << 30;
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

  // Admits a new request: returns once the blocks of its prompt are held (it
  // then waits for its KV), after waiting in the queue while they are not
  // free. RESOURCE_EXHAUSTED when the queue holds max_waiting requests, when
  // spec.max_tokens() tokens exceed the whole pool, or when `caller` (a
  // peer's host; empty: not counted) would hold more than
  // max_pending_kv_share of the pool in the prompt blocks of reservations
  // awaiting their KV; CANCELLED when `cancel` (may be null)
  // fired while queued; UNAVAILABLE when draining or shutting down;
  // ALREADY_EXISTS for a duplicate id; INVALID_ARGUMENT for bad sampling or
  // sizes.
  absl::StatusOr<std::shared_ptr<Request>> Reserve(const DecodeSpec& spec,
                                                   const CancelToken* cancel = nullptr,
                                                   const std::string& caller = "");
  // KvHandler: a reserved request's prefilled rows and first token. The
  // request joins the running batch, or ends at once if the first token
  // ends it (a stop id, max_new_tokens 1). INVALID_ARGUMENT for a first
  // token outside the vocabulary.
  absl::Status PushKv(const KvTransfer& transfer) override;
  // Ends a request nobody decodes (its blocks are freed); nothing if it ended.
  void Release(const std::shared_ptr<Request>& request);
  // Leading prompt tokens whose KV rows a reserved request's sequence holds
  // from the prefix cache (PushKv then needs only the rest); 0 once it ended.
  int HeldTokens(const Request& request) const;

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
  // A request in a step and the tokens it feeds: 1 for a decode, a chunk of
  // its prompt (+ output) for one computing it.
  struct StepItem {
    std::shared_ptr<Request> request;
    int tokens = 1;
  };
  // One step over `batch` (on failure every request in it fails).
  void Step(const std::vector<StepItem>& batch);
  // Admits queued requests in order while their blocks are free (leaving one
  // block per running request for its next step); stops at the first that
  // does not fit. A preempted one resumes running.
  void Admit() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The running requests (not cancelled) for the next step: decodes in
  // priority order, each with room for its next token (preempting where the
  // pool is dry), then prompt chunks in priority order within the budget.
  std::vector<StepItem> PlanStep() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees a running request's blocks and queues it to resume, by swap
  // (SwapOut) or by recompute.
  void Preempt(const std::shared_ptr<Request>& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies r's rows into host memory it owns; false (counted as a fallback
  // where it had rows) if there are none, they would pass swap_space_bytes,
  // or the copy failed.
  bool SwapOut(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes a swapped request's rows into its new sequence r->kv and frees
  // the host copy.
  absl::Status SwapIn(Request* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Blocks for `tokens` tokens in a pool of u.block_size (0 without a pool).
  static int BlocksFor(const KvUsage& u, int tokens);
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
  prometheus::Gauge* waiting_gauge_ = nullptr;
  prometheus::Counter* preempt_recompute_ = nullptr;
  prometheus::Counter* preempt_swap_ = nullptr;
  prometheus::Counter* swap_fallbacks_ = nullptr;
  prometheus::Gauge* swapped_bytes_gauge_ = nullptr;
  prometheus::Histogram* swap_out_seconds_ = nullptr;
  prometheus::Histogram* swap_in_seconds_ = nullptr;
  prometheus::Counter* tokens_ = nullptr;
  prometheus::Histogram* step_seconds_ = nullptr;
  prometheus::Histogram* batch_size_ = nullptr;
  prometheus::Histogram* step_tokens_ = nullptr;
  prometheus::Counter* prompt_chunks_ = nullptr;
  // The backend pool's prefix cache (the prefill engine sharing the pool
  // counts there too). Updated under mu_.
  std::unique_ptr<PrefixCacheMetrics> prefix_metrics_;
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::atomic<bool> logged_device_kv_{false};  // the first device-to-device KV handoff is logged
  bool logged_swap_fallback_ = false;          // the first swap fallback is logged
  // Host bytes the swapped requests' rows hold (SwappedKv counts itself).
  std::atomic<int64_t> swapped_bytes_{0};
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Request>> requests_ ABSL_GUARDED_BY(mu_);
  // Requests waiting for blocks, by (priority, arrival): new ones before
  // admission, preempted ones before they resume. Also in requests_.
  std::map<std::pair<int, uint64_t>, std::shared_ptr<Request>> waiting_ ABSL_GUARDED_BY(mu_);
  int waiting_new_ ABSL_GUARDED_BY(mu_) = 0;  // of waiting_, never admitted
  uint64_t next_arrival_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t num_preemptions_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t steps_ ABSL_GUARDED_BY(mu_) = 0;           // steps planned
  uint64_t frees_ ABSL_GUARDED_BY(mu_) = 0;           // requests ended (blocks freed)
  uint64_t frees_admitted_ ABSL_GUARDED_BY(mu_) = 0;  // frees_ at the loop's last Admit
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int kv_arriving_ ABSL_GUARDED_BY(mu_) = 0;  // PushKv calls storing rows now
  // Caller -> blocks its reservations awaiting their KV hold (no zero entries).
  std::map<std::string, int> pending_blocks_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_SERVING_DECODE_ENGINE_H_
