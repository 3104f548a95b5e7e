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

namespace moesh {

KvOptions KvOptionsFromFlags() {
  KvOptions o;
  o.kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  o.block_size = absl::GetFlag(FLAGS_block_size);
  o.max_batch = absl::GetFlag(FLAGS_max_batch);
  return o;
}

}  // namespace moesh
