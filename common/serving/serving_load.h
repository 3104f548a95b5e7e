// What a prefill or decode worker's core reports about its load (the
// heartbeats carry it to the router, which places requests by it).
#ifndef MOESH_COMMON_SERVING_SERVING_LOAD_H_
#define MOESH_COMMON_SERVING_SERVING_LOAD_H_

#include <cstdint>
#include <vector>

namespace moesh {

// The most block hashes a worker reports (and a router accepts) per
// heartbeat: 8 KiB, the prompts of a busy worker's last few minutes.
inline constexpr int kMaxReportedBlockHashes = 1024;
// The largest cache block size a router accepts in a report.
inline constexpr int kMaxReportedBlockSize = 1 << 16;

struct ServingLoad {
  int64_t queued_prompt_tokens = 0;  // admitted, not yet prefilled (prefill workers)
  int num_running = 0;               // decoding now (decode workers)
  double kv_usage = 0;               // fraction of KV blocks in use, [0, 1]
  int free_kv_blocks = 0;
  bool draining = false;    // shutting down: finishing what it holds, taking nothing new
  int in_flight = 0;        // requests held: queued, prefilling, reserved or decoding
  int num_waiting = 0;      // queued for KV blocks (decode workers): new or preempted
  int64_t preemptions = 0;  // running requests preempted so far (decode workers)
  // The prefix cache's blocks (AttentionBackend::CachedBlockHashes), at most
  // kMaxReportedBlockHashes, and its block size (0: no prefix cache).
  std::vector<uint64_t> cached_block_hashes;
  int cache_block_size = 0;
};

}  // namespace moesh

#endif  // MOESH_COMMON_SERVING_SERVING_LOAD_H_
