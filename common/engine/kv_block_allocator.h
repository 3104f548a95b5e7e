// The block bookkeeping of a paged KV pool, with its automatic prefix cache,
// apart from where the blocks' rows live: the CPU pool (paged_kv_cache.h)
// keeps them in host memory, the CUDA backend's (common/cuda_backend/
// kv_pool.h) on the device; both hand out and share blocks through this.
//
// Prefix cache (vLLM's automatic prefix caching). A full block whose rows a
// sequence wrote is published under its block hash: a hash chained over the
// parent block's hash and the block's token ids (PrefixBlockHashes), so equal
// hashes mean equal token prefixes up to and including the block. A new
// sequence for a prompt (Allocate with `prefix`) starts with the longest run
// of published blocks that begins the prompt, shared read-only and
// reference-counted, and computes only the rest. Block hashes rather than a
// radix tree (SGLang): the unit of sharing is the pool's block anyway (a
// tree's token-level splits would still have to be rounded to blocks), the
// lookup is one hash-map probe per block with no tree to rebalance or lock
// around, and a worker's cache is summarised by a set of 64-bit hashes that
// is cheap to report to a router for KV-aware routing (the same function
// computes them there). Only full blocks are shared, so a sequence never
// writes into a shared block: its last, partial block is always its own
// (copy-on-write at block granularity without copying: the rows it appends
// go to fresh blocks).
//
// Block life: free → held (reference count > 0; by sequences) → when the
// last reference goes, back to free if unpublished, else "cached": kept with
// its rows in LRU order, counted in free_blocks() (it is reclaimable), and
// evicted (its hash forgotten) only when Take needs a block and no plain
// free one is left. A sequence's blocks enter that order last block first,
// so a prefix loses its tail before its head (a block is reachable only
// through every block before it). A cached block matched again is held
// again.
//
// Thread-safe.
#ifndef MOESH_COMMON_ENGINE_KV_BLOCK_ALLOCATOR_H_
#define MOESH_COMMON_ENGINE_KV_BLOCK_ALLOCATOR_H_

#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace moesh {

// The block hashes of the full blocks of `tokens` (tokens.size() /
// block_size of them): hash[i] = H(hash[i-1], tokens of block i), hash[-1] a
// fixed seed. Deterministic across processes and builds (FNV-1a style over
// 64-bit words with a final mix), so a router can compute the hashes a
// worker reports. REQUIRES: block_size >= 1.
std::vector<uint64_t> PrefixBlockHashes(absl::Span<const int32_t> tokens, int block_size);

// Counters of a pool's prefix cache since it was made.
struct PrefixCacheStats {
  int64_t hit_tokens = 0;   // prompt tokens whose rows came from the cache
  int64_t miss_tokens = 0;  // prompt tokens looked up and not found
  int64_t evictions = 0;    // cached blocks reclaimed for new rows
  int cached_blocks = 0;    // published blocks now (held or reclaimable)
};

// A new sequence's blocks (Allocate): the shared prefix first.
struct KvBlockRun {
  std::vector<int> blocks;       // held: the matched prefix's, then fresh ones
  std::vector<uint64_t> hashes;  // the matched blocks' hashes (PublishPrefix's state)
  int cached_tokens = 0;         // rows the matched blocks hold (a multiple of block_size)
};

class KvBlockAllocator {
 public:
  // Block ids 0 .. num_blocks-1, the lowest handed out first. Without
  // `prefix_cache` no block is ever published (Allocate's prefix is ignored).
  // REQUIRES: block_size >= 1, num_blocks >= 0.
  KvBlockAllocator(int block_size, int num_blocks, bool prefix_cache);

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  bool prefix_cache() const { return prefix_cache_; }
  // Blocks for `tokens` tokens.
  int BlocksFor(int tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  // Blocks a new sequence may take: plain free ones plus cached ones nobody
  // holds (evicted on demand).
  int free_blocks() const;
  // Fraction of blocks held by sequences, [0, 1].
  float usage() const;
  PrefixCacheStats stats() const;
  // The hashes of the published blocks, held ones first, then the
  // reclaimable ones most recently used first; at most `max` (a summary for
  // a router).
  std::vector<uint64_t> CachedHashes(int max) const;

  // The blocks of a sequence able to hold `max_tokens` tokens, held now.
  // `prefix`: the tokens it will hold first (a prompt); it starts with the
  // longest run of published blocks that begins `prefix`, at most
  // prefix.size() - 1 tokens (a forward pass needs a token to compute). The
  // lookup is counted in stats() (hits and misses over prefix.size() tokens).
  // RESOURCE_EXHAUSTED (holding nothing) if too few blocks are free.
  absl::StatusOr<KvBlockRun> Allocate(int max_tokens, absl::Span<const int32_t> prefix = {});
  // Appends `n` blocks to *blocks, plain free ones first, then evicting the
  // least recently used cached ones; RESOURCE_EXHAUSTED (taking none) if
  // fewer are reclaimable.
  absl::Status Take(int n, std::vector<int>* blocks);
  // Drops one reference to each block, the last first.
  void Free(absl::Span<const int> blocks);
  // Publishes a sequence's full blocks not yet published: `blocks` its block
  // table, `length` the rows written (in every layer), `tokens` the token ids
  // of those rows (at least the ones to publish), *hashes the hashes of its
  // leading blocks already matched or published (extended here). A block
  // whose hash another held block already has stays private. A no-op without
  // the prefix cache.
  void PublishPrefix(absl::Span<const int> blocks, int length, absl::Span<const int32_t> tokens,
                     std::vector<uint64_t>* hashes);

 private:
  struct BlockInfo {
    int refs = 0;
    bool published = false;
    uint64_t hash = 0;
    uint64_t parent = 0;           // the previous block's hash (the seed for the first)
    std::vector<int32_t> tokens;   // published: the block's tokens (checked on a match)
    std::list<int>::iterator lru;  // published with refs == 0: its place in lru_
  };
  absl::Status TakeLocked(int n, std::vector<int>* blocks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes `block` (full, its rows written) under `hash`. If a block held
  // by a sequence already has that hash, `block` stays private; an idle one
  // (reclaimable) is replaced by `block` and freed.
  void PublishLocked(int block, uint64_t hash, uint64_t parent, absl::Span<const int32_t> tokens)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int block_size_;
  const int num_blocks_;
  const bool prefix_cache_;

  mutable absl::Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);  // unpublished, refs == 0
  std::vector<BlockInfo> info_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, int> by_hash_ ABSL_GUARDED_BY(mu_);  // published blocks
  std::list<int> lru_ ABSL_GUARDED_BY(mu_);  // published, refs == 0; least recent first
  PrefixCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moesh

#endif  // MOESH_COMMON_ENGINE_KV_BLOCK_ALLOCATOR_H_
