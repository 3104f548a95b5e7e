// Paged KV cache on the host: a pool of fixed-size blocks shared by the
// requests of one worker, per-request sequences holding a block table, and
// the automatic prefix cache over the blocks (kv_block_allocator.h: block
// hashes, reference counts, LRU eviction, copy-on-write at block
// granularity). The rows cached are whole cache rows: MLA's latent and roped
// key, with V3.2's indexer key and V4's compressor inputs in the same row
// (common/model/kv_cache.h), so every family is cached whole.
//
// KvBlockPool is thread-safe. A PagedKvSequence is owned by one request and
// drops its references when destroyed.
#ifndef MOESH_COMMON_ENGINE_PAGED_KV_CACHE_H_
#define MOESH_COMMON_ENGINE_PAGED_KV_CACHE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/engine/kv_block_allocator.h"
#include "common/model/kv_cache.h"

namespace moesh {

class PagedKvSequence;

class KvBlockPool {
 public:
  // Storage: num_blocks × [num_layers, block_size, row_width] float32.
  // Without `prefix_cache` no block is ever published (Allocate's prefix is
  // ignored).
  // Rows are stored as `format` gives them back (an FP8 cache's rows).
  KvBlockPool(int num_layers, int row_width, int block_size, int num_blocks,
              bool prefix_cache = false, KvRowFormat format = {});

  int num_layers() const { return num_layers_; }
  int row_width() const { return row_width_; }
  int block_size() const { return blocks_.block_size(); }
  int num_blocks() const { return blocks_.num_blocks(); }
  bool prefix_cache() const { return blocks_.prefix_cache(); }
  // KvBlockAllocator's.
  int free_blocks() const { return blocks_.free_blocks(); }
  float usage() const { return blocks_.usage(); }
  int BlocksFor(int tokens) const { return blocks_.BlocksFor(tokens); }
  PrefixCacheStats stats() const { return blocks_.stats(); }
  std::vector<uint64_t> CachedHashes(int max) const { return blocks_.CachedHashes(max); }

  // A sequence able to hold `max_tokens` tokens, its blocks taken now
  // (KvBlockAllocator::Allocate: RESOURCE_EXHAUSTED holding nothing if too
  // few are free). It starts with the rows of the longest cached run of
  // blocks beginning `prefix`, as its length() and cached_tokens().
  absl::StatusOr<std::unique_ptr<PagedKvSequence>> Allocate(int max_tokens,
                                                            absl::Span<const int32_t> prefix = {});

 private:
  friend class PagedKvSequence;
  float* Slot(int block, int layer, int slot) {
    return storage_.data() +
           ((static_cast<size_t>(block) * num_layers_ + layer) * block_size() + slot) * row_width_;
  }

  const int num_layers_;
  const int row_width_;
  const KvRowFormat format_;
  KvBlockAllocator blocks_;
  std::vector<float> storage_;  // blocks' rows; written only by their first holder
};

class PagedKvSequence : public KvSequence {
 public:
  ~PagedKvSequence() override { pool_->blocks_.Free(blocks_); }
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
