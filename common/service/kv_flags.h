// The flags of the KV cache and the decode batch: the decode worker's, and
// the router's in colocated mode.
#ifndef MOESH_COMMON_SERVICE_KV_FLAGS_H_
#define MOESH_COMMON_SERVICE_KV_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace moesh {

// The defaults are the flags' defaults (kv_flags.cc).
struct KvOptions {
  int kv_blocks = 1024;  // --kv_blocks (--device cpu)
  int block_size = 64;   // --block_size (--device cpu)
  int max_batch = 256;   // --max_batch: most requests decoded per step
  // --max_waiting_requests: requests a decode worker queues for KV blocks
  // (FCFS within a priority) before it answers RESOURCE_EXHAUSTED; 0: none.
  int max_waiting_requests = 1024;
  // --enable_prefix_caching: reuse the KV of cached prompt prefixes
  // (--device cpu; see common/engine/paged_kv_cache.h).
  bool enable_prefix_caching = true;
  // --max_num_batched_tokens: chunked prefill's token budget. A decode step
  // (decode worker, colocated router) computes the running decodes' tokens
  // first and prompt chunks in the rest; a prefill worker splits a longer
  // prompt into chunks of at most this many tokens, one per pass, so prompts
  // queued behind it run in between. 0: no chunking. 1024: on a GPU colocated
  // router at V2-Lite's shapes it keeps 2048's throughput (24.7 against 25.0
  // requests/s, 512 + 128 tokens) and holds ITL p99 within 3x p50 at 80% of
  // that load, where 2048 gives 3.8x at 64% (BENCHMARKS.md).
  int max_num_batched_tokens = 1024;
  // --preemption_mode: how a request preempted when the KV pool runs dry
  // resumes (decode worker, colocated router): "recompute" (its blocks freed,
  // its KV recomputed) or "swap" (its rows copied to host memory, copied
  // back). See common/serving/decode_engine.h.
  std::string preemption_mode = "recompute";
  // --swap_space_mb: host memory the swapped requests' KV rows may hold
  // together (swap mode); a preemption past it recomputes instead (counted).
  int swap_space_mb = 4096;
};

// --kv_blocks, --block_size, --max_batch, --max_waiting_requests,
// --enable_prefix_caching, --max_num_batched_tokens, --preemption_mode,
// --swap_space_mb. INVALID_ARGUMENT for a negative --max_num_batched_tokens
// or --swap_space_mb or an unknown --preemption_mode; the rest unchecked (the decode worker
// wants the first three >= 1, max_waiting_requests >= 0).
absl::StatusOr<KvOptions> KvOptionsFromFlags();
// The flags that set `o` (flag_args.cc).
void AppendArgs(const KvOptions& o, std::vector<std::string>* args);

}  // namespace moesh

#endif  // MOESH_COMMON_SERVICE_KV_FLAGS_H_
