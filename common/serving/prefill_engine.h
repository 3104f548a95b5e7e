// The prefill worker's core: batches the prompts that arrive together into
// one forward pass (attention here, routed experts through the ExpertClient),
// samples each request's first token, and hands each prompt's KV cache, the
// first token with it, to the decode worker holding its reservation.
//
// Chunked prefill (max_chunk_tokens > 0): a pass computes at most
// max_chunk_tokens of one prompt. A longer prompt keeps its sequence (the
// KV of the chunks so far) and goes back to the queue's tail, so the
// prompts queued behind it get the next pass; its KV is handed over after
// its last chunk. A prompt asking for prompt log-probabilities is chunked
// too: each chunk's pass scores the tokens after each of its positions (its
// last, the next chunk's first), and the chunks' entries joined are the
// whole prompt's. Such a prompt reads no rows from the prefix cache (every
// position's logits are needed; cached_tokens is 0), its blocks join it.
//
// Thread-safe: Prefill is called concurrently by RPC handlers. Owns one thread.
#ifndef MOESH_COMMON_SERVING_PREFILL_ENGINE_H_
#define MOESH_COMMON_SERVING_PREFILL_ENGINE_H_

#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/thread_pool.h"
#include "common/engine/attention_backend.h"
#include "common/engine/sampler.h"
#include "common/metrics/metrics.h"
#include "common/serving/generation_flow.h"
#include "common/serving/prefix_cache_metrics.h"
#include "common/serving/serving_load.h"
#include "common/transport/kv_handoff.h"
#include "common/transport/transport.h"

namespace moesh {

struct PrefillEngineOptions {
  // Prompt tokens per forward pass (a longer single prompt still runs alone).
  int max_batch_tokens = 8192;
  // The longest chunk of one prompt a pass computes (header comment); 0: a
  // prompt runs whole.
  int max_chunk_tokens = 0;
  // Ping-pong micro-batches per forward when the experts are remote (1: off).
  int micro_batches = 2;
  // How the KV reaches the decode worker: rows in the message, or (kDevice:
  // CUDA backends of one node over cuda_ipc) copied from this worker's
  // device memory by the decode worker.
  KvHandoff kv_handoff = KvHandoff::kHost;
  Metrics* metrics = nullptr;  // may be null
  // Export the backend's prefix cache metrics (off where a decode engine
  // sharing the pool exports them: colocated).
  bool prefix_cache_metrics = true;
};

class PrefillEngine {
 public:
  // Borrowed: backend, experts, transport; they must outlive the engine.
  // `experts` is null iff backend->has_experts().
  PrefillEngine(AttentionBackend* backend, ExpertClient* experts, Transport* transport,
                PrefillEngineOptions options);
  ~PrefillEngine();  // fails queued requests with UNAVAILABLE

  // Blocks until the prompt ran and its KV and first token reached the
  // decode worker. INVALID_ARGUMENT for bad prompts or sampling, UNAVAILABLE
  // if an expert or the decode worker failed. CANCELLED when `cancel` (may be
  // null) fired while the prompt still waited in the queue (it leaves the
  // queue at once; a prompt already in a running batch finishes). While the
  // backend's KV pool has no room for the batch (a GPU's, or the pool a
  // colocated decode engine shares), the prompts wait in the queue for it.
  absl::Status Prefill(const PrefillSpec& spec, const CancelToken* cancel = nullptr);

  // Graceful shutdown: from now on Prefill answers UNAVAILABLE; prompts
  // queued or running finish (Load().in_flight counts them down).
  void Drain();

  ServingLoad Load() const;

 private:
  bool HostKvOnly(const std::string& address) const;
  struct Pending {
    explicit Pending(const PrefillSpec* s) : spec(s) {}
    const PrefillSpec* spec;
    std::chrono::steady_clock::time_point queued_at = std::chrono::steady_clock::now();
    double queue_seconds = 0;
    // From its first pass on: the rows computed so far (and the prefix
    // cache's). Touched by the engine thread while in a pass, under mu_
    // while queued.
    std::unique_ptr<KvSequence> kv;
    int cached_tokens = 0;
    PromptLogprobs prompt_logprobs;  // when asked: its chunks' so far, joined
    bool cancelled = false;          // while in a pass: it ends after the pass
    bool done = false;
    absl::Status result = absl::UnknownError("not run");
    // Prompt tokens still to compute.
    int remaining() const {
      return static_cast<int>(spec->prompt_ids.size()) - (kv != nullptr ? kv->length() : 0);
    }
  };
  // A prompt in a pass and the tokens of it the pass computes.
  struct Piece {
    Pending* p;
    int tokens;
  };
  void Loop();
  // The next pass's pieces, taken from the queue in order (empty: wait for
  // KV blocks).
  std::vector<Piece> TakeBatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes `p` out of the queue as CANCELLED if it is still there.
  void CancelQueued(Pending* p);
  void UpdateQueueGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunBatch(const std::vector<Piece>& batch);
  // Ends `p` with `result` (its blocks freed); its caller returns.
  void Finish(Pending* p, absl::Status result);
  absl::StatusOr<DataChannel*> ChannelTo(const std::string& address);

  AttentionBackend* const backend_;
  ExpertClient* const experts_;
  Transport* const transport_;
  const PrefillEngineOptions options_;

  // Null without metrics.
  prometheus::Gauge* waiting_ = nullptr;
  prometheus::Gauge* queued_tokens_gauge_ = nullptr;
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* chunks_ = nullptr;
  prometheus::Histogram* batch_seconds_ = nullptr;
  prometheus::Counter* kv_bytes_ = nullptr;
  prometheus::Histogram* kv_seconds_ = nullptr;
  std::unique_ptr<PrefixCacheMetrics> prefix_metrics_;  // updated by the engine thread

  mutable absl::Mutex mu_;
  std::deque<Pending*> queue_ ABSL_GUARDED_BY(mu_);
  int64_t queued_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  int running_ ABSL_GUARDED_BY(mu_) = 0;  // prompts in the batch being run
  std::map<std::string, std::unique_ptr<DataChannel>> channels_ ABSL_GUARDED_BY(mu_);
  // Decode workers that cannot take KV from this worker's device memory.
  std::set<std::string> host_kv_only_ ABSL_GUARDED_BY(mu_);
  // A batch's KV handoffs beyond the first, side by side (RunBatch).
  static constexpr size_t kConcurrentHandoffs = 32;
  ThreadPool handoff_pool_;
  std::thread thread_;  // last: joined before the pool goes
};

}  // namespace moesh

#endif  // MOESH_COMMON_SERVING_PREFILL_ENGINE_H_
