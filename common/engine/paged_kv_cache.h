// Paged KV cache: a pool of fixed-size blocks shared by the requests of one
// worker, per-request sequences holding a block table, and an automatic
// prefix cache over the blocks.
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
// go to fresh blocks). The rows cached are whole cache rows: MLA's latent
// and roped key, with V3.2's indexer key and V4's compressor inputs in the
// same row (common/model/kv_cache.h), so every family is cached whole.
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
// KvBlockPool is thread-safe. A PagedKvSequence is owned by one request and
// drops its references when destroyed.
#ifndef MOESH_COMMON_ENGINE_PAGED_KV_CACHE_H_
#define MOESH_COMMON_ENGINE_PAGED_KV_CACHE_H_

#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/model/kv_cache.h"

namespace moesh {

class PagedKvSequence;

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

class KvBlockPool {
 public:
  // Storage: num_blocks × [num_layers, block_size, row_width] float32.
  // Without `prefix_cache` no block is ever published (Allocate's prefix is
  // ignored).
  KvBlockPool(int num_layers, int row_width, int block_size, int num_blocks,
              bool prefix_cache = false);

  int num_layers() const { return num_layers_; }
  int row_width() const { return row_width_; }
  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  bool prefix_cache() const { return prefix_cache_; }
  // Blocks a new sequence may take: plain free ones plus cached ones nobody
  // holds (evicted on demand).
  int free_blocks() const;
  // Fraction of blocks held by sequences, [0, 1].
  float usage() const;
  // Blocks needed for `tokens` tokens.
  int BlocksFor(int tokens) const { return (tokens + block_size_ - 1) / block_size_; }
  PrefixCacheStats stats() const;
  // The hashes of the published blocks, most recently used first, at most
  // `max` of them (a summary for a router).
  std::vector<uint64_t> CachedHashes(int max) const;

  // A sequence able to hold `max_tokens` tokens, its blocks taken now.
  // RESOURCE_EXHAUSTED (holding nothing) if fewer blocks are free.
  // `prefix`: the tokens the sequence will hold first (a prompt); the
  // sequence starts with the rows of the longest run of published blocks
  // that begins it, at most prefix.size() - 1 tokens (a forward pass needs a
  // token to compute), as its length() and cached_tokens(). The lookup is
  // counted in stats() (hits and misses over prefix.size() tokens).
  absl::StatusOr<std::unique_ptr<PagedKvSequence>> Allocate(int max_tokens,
                                                            absl::Span<const int32_t> prefix = {});

 private:
  friend class PagedKvSequence;
  struct BlockInfo {
    int refs = 0;
    bool published = false;
    uint64_t hash = 0;
    uint64_t parent = 0;           // the previous block's hash (the seed for the first)
    std::vector<int32_t> tokens;   // published: the block's tokens (checked on a match)
    std::list<int>::iterator lru;  // published with refs == 0: its place in lru_
  };
  // Appends `n` blocks to *blocks, plain free ones first, then evicting the
  // least recently used cached ones; RESOURCE_EXHAUSTED (taking none) if
  // fewer are reclaimable.
  absl::Status Take(int n, std::vector<int>* blocks);
  absl::Status TakeLocked(int n, std::vector<int>* blocks) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops one reference to each block.
  void Free(const std::vector<int>& blocks);
  // Publishes `block` (full, its rows written) under `hash`. If a block held
  // by a sequence already has that hash, `block` stays private; an idle one
  // (reclaimable) is replaced by `block` and freed.
  void Publish(int block, uint64_t hash, uint64_t parent, absl::Span<const int32_t> tokens);
  float* Slot(int block, int layer, int slot) {
    return storage_.data() +
           ((static_cast<size_t>(block) * num_layers_ + layer) * block_size_ + slot) * row_width_;
  }

  const int num_layers_;
  const int row_width_;
  const int block_size_;
  const int num_blocks_;
  const bool prefix_cache_;
  std::vector<float> storage_;  // blocks' rows; written only by their first holder

  mutable absl::Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);  // unpublished, refs == 0
  std::vector<BlockInfo> info_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<uint64_t, int> by_hash_ ABSL_GUARDED_BY(mu_);  // published blocks
  std::list<int> lru_ ABSL_GUARDED_BY(mu_);  // published, refs == 0; least recent first
  PrefixCacheStats stats_ ABSL_GUARDED_BY(mu_);
};

class PagedKvSequence : public KvSequence {
 public:
  ~PagedKvSequence() override { pool_->Free(blocks_); }
  PagedKvSequence(const PagedKvSequence&) = delete;
  PagedKvSequence& operator=(const PagedKvSequence&) = delete;

  int row_width() const override { return pool_->row_width(); }
  int length() const override { return length_; }
  int num_rows(int layer) const override { return rows_[layer]; }
  int capacity() const override { return static_cast<int>(blocks_.size()) * pool_->block_size(); }
  int cached_tokens() const override { return cached_tokens_; }
  // Takes blocks from the pool until capacity() >= tokens.
  absl::Status Reserve(int tokens) override;
  void AppendRows(int layer, const float* src, int n) override;
  const float* Rows(int layer, std::vector<float>* scratch) const override;
  // Publishes the full blocks within both length() and `tokens` not yet
  // published (a no-op without the pool's prefix cache).
  void PublishPrefix(absl::Span<const int32_t> tokens) override;
  const std::vector<int>& block_table() const { return blocks_; }

 private:
  friend class KvBlockPool;
  PagedKvSequence(KvBlockPool* pool, std::vector<int> blocks)
      : pool_(pool), blocks_(std::move(blocks)), rows_(pool->num_layers(), 0) {}

  KvBlockPool* const pool_;
  std::vector<int> blocks_;  // grows (Reserve), never shrinks
  std::vector<int> rows_;    // rows written per layer
  int length_ = 0;
  int cached_tokens_ = 0;         // leading rows shared from the prefix cache
  std::vector<uint64_t> hashes_;  // block hashes of the leading blocks matched or published
};

}  // namespace moesh

#endif  // MOESH_COMMON_ENGINE_PAGED_KV_CACHE_H_
