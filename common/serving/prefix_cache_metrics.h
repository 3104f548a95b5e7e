// A backend's prefix cache as a worker reports it: ReportPrefixCache (the
// heartbeat's summary for KV-aware routing) and the Prometheus metrics (common/engine/
// paged_kv_cache.h): hit and miss tokens, evictions (counters) and cached
// blocks (gauge), exported from the pool's cumulative counters. One per KV
// pool: the engine owning the pool updates it (in colocated mode the decode
// engine; the prefill engine sharing the pool exports none).
//
// Not thread-safe: the owner serialises Update calls.
#ifndef MOESH_COMMON_SERVING_PREFIX_CACHE_METRICS_H_
#define MOESH_COMMON_SERVING_PREFIX_CACHE_METRICS_H_

#include "common/engine/attention_backend.h"
#include "common/engine/paged_kv_cache.h"
#include "common/metrics/metrics.h"
#include "common/serving/serving_load.h"

namespace moesh {

// Fills load's prefix cache summary from `backend` (nothing without a cache).
inline void ReportPrefixCache(const AttentionBackend& backend, ServingLoad* load) {
  load->cached_block_hashes = backend.CachedBlockHashes(kMaxReportedBlockHashes);
  load->cache_block_size = load->cached_block_hashes.empty() ? 0 : backend.kv_usage().block_size;
}

class PrefixCacheMetrics {
 public:
  // Registers the metrics in `metrics` (borrowed, must outlive this).
  explicit PrefixCacheMetrics(Metrics* metrics)
      : hits_(&metrics
                   ->CounterFamily("moesh_prefix_cache_hit_tokens_total",
                                   "Prompt tokens whose KV rows came from the prefix cache.")
                   .Add({})),
        misses_(&metrics
                     ->CounterFamily("moesh_prefix_cache_miss_tokens_total",
                                     "Prompt tokens looked up in the prefix cache and not found.")
                     .Add({})),
        evictions_(&metrics
                        ->CounterFamily("moesh_prefix_cache_evictions_total",
                                        "Cached KV blocks reclaimed for new rows.")
                        .Add({})),
        blocks_(&metrics
                     ->GaugeFamily("moesh_prefix_cache_blocks",
                                   "KV blocks the prefix cache holds (in use or reclaimable).")
                     .Add({})) {}

  // Brings the metrics to `now` (the pool's counters, which only grow).
  void Update(const PrefixCacheStats& now) {
    hits_->Increment(static_cast<double>(now.hit_tokens - reported_.hit_tokens));
    misses_->Increment(static_cast<double>(now.miss_tokens - reported_.miss_tokens));
    evictions_->Increment(static_cast<double>(now.evictions - reported_.evictions));
    blocks_->Set(now.cached_blocks);
    reported_ = now;
  }

 private:
  prometheus::Counter* const hits_;
  prometheus::Counter* const misses_;
  prometheus::Counter* const evictions_;
  prometheus::Gauge* const blocks_;
  PrefixCacheStats reported_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_SERVING_PREFIX_CACHE_METRICS_H_
