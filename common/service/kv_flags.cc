#include "common/service/kv_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(int, kv_blocks, moesh::KvOptions().kv_blocks,
          "KV cache blocks on --device cpu (CUDA sizes its cache from --gpu_memory_utilization). "
          "The router uses it only with --colocated.");
ABSL_FLAG(int, block_size, moesh::KvOptions().block_size,
          "Tokens per KV cache block on --device cpu (CUDA: 64). The router uses it only with "
          "--colocated.");
ABSL_FLAG(int, max_batch, moesh::KvOptions().max_batch,
          "Most requests decoded per step (and sequences a CUDA KV cache holds). The router uses "
          "it only with --colocated.");

ABSL_FLAG(int, max_waiting_requests, moesh::KvOptions().max_waiting_requests,
          "Requests a decode worker queues while its KV cache has no room for their prompts (first "
          "come, first served within a priority) before it refuses more with RESOURCE_EXHAUSTED; "
          "0: no queue. The router uses it only with --colocated.");

ABSL_FLAG(bool, enable_prefix_caching, moesh::KvOptions().enable_prefix_caching,
          "Reuse the KV cache rows of prompt prefixes seen before (full blocks, looked up by "
          "block hash; evicted least recently used when the pool needs the blocks), computing "
          "only the rest of a prompt. --device cpu (CUDA says at startup that it runs without). "
          "The router uses it only with --colocated.");

namespace moesh {

KvOptions KvOptionsFromFlags() {
  KvOptions o;
  o.kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.max_batch = absl::GetFlag(FLAGS_max_batch);
  o.max_waiting_requests = absl::GetFlag(FLAGS_max_waiting_requests);
  o.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  return o;
}

}  // namespace moesh
