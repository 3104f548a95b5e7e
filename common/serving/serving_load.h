// What a prefill or decode worker's core reports about its load (the
// heartbeats carry it to the router, which places requests by it).
#ifndef MOESH_COMMON_SERVING_SERVING_LOAD_H_
#define MOESH_COMMON_SERVING_SERVING_LOAD_H_

#include <cstdint>

namespace moesh {

struct ServingLoad {
  int64_t queued_prompt_tokens = 0;  // admitted, not yet prefilled (prefill workers)
  int num_running = 0;               // decoding now (decode workers)
  double kv_usage = 0;               // fraction of KV blocks in use, [0, 1]
  int free_kv_blocks = 0;
  bool draining = false;    // shutting down: finishing what it holds, taking nothing new
  int in_flight = 0;        // requests held: queued, prefilling, reserved or decoding
  int num_waiting = 0;      // queued for KV blocks (decode workers): new or preempted
  int64_t preemptions = 0;  // running requests preempted so far (decode workers)
};

}  // namespace moesh

#endif  // MOESH_COMMON_SERVING_SERVING_LOAD_H_
