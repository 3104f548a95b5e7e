#include "common/service/kv_flags.h"

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/serving/decode_engine.h"

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

ABSL_FLAG(int, max_num_batched_tokens, moesh::KvOptions().max_num_batched_tokens,
          "Chunked prefill's token budget per forward step. A decode step (decode worker, "
          "colocated router) computes one token for each running request first and fills the "
          "rest with prompt chunks, so a long prompt no longer stalls running streams; a prefill "
          "worker splits a longer prompt into chunks of at most this many tokens, one per pass, "
          "running the prompts queued behind it in between. 0: no chunking (a prompt runs whole "
          "in one pass). Must be >= 0.");

ABSL_FLAG(std::string, preemption_mode, moesh::KvOptions().preemption_mode,
          "How a running request preempted because the KV cache ran dry resumes (decode worker, "
          "colocated router): 'recompute' frees its blocks and recomputes its KV (prompt + "
          "output, in chunks under --max_num_batched_tokens) when it resumes; 'swap' copies its "
          "KV rows to host memory, frees its blocks, and copies the rows back when it resumes, "
          "computing nothing again. Swapped rows past --swap_space_mb recompute instead "
          "(moesh_decode_swap_fallbacks_total). The router uses it only with --colocated.");
ABSL_FLAG(int, swap_space_mb, moesh::KvOptions().swap_space_mb,
          "Host memory (MiB) the KV rows of requests swapped out (--preemption_mode=swap) may "
          "hold together; a preemption that would pass it recomputes instead, counted in "
          "moesh_decode_swap_fallbacks_total. Must be >= 0. The router uses it only with "
          "--colocated.");

namespace moesh {

absl::StatusOr<KvOptions> KvOptionsFromFlags() {
  KvOptions o;
  o.kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.max_batch = absl::GetFlag(FLAGS_max_batch);
  o.max_waiting_requests = absl::GetFlag(FLAGS_max_waiting_requests);
  o.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  o.max_num_batched_tokens = absl::GetFlag(FLAGS_max_num_batched_tokens);
  if (o.max_num_batched_tokens < 0) {
    return absl::InvalidArgumentError(
        "--max_num_batched_tokens must be >= 0 (0: no chunked prefill), got " +
        std::to_string(o.max_num_batched_tokens));
  }
  o.preemption_mode = absl::GetFlag(FLAGS_preemption_mode);
  o.swap_space_mb = absl::GetFlag(FLAGS_swap_space_mb);
  if (absl::StatusOr<PreemptionMode> mode = ParsePreemptionMode(o.preemption_mode); !mode.ok())
    return absl::InvalidArgumentError(absl::StrCat("--preemption_mode: ", mode.status().message()));
  if (o.swap_space_mb < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--swap_space_mb must be >= 0, got ", o.swap_space_mb));
  }
  return o;
}

}  // namespace moesh
