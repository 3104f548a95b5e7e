// Paged KV cache: a pool of fixed-size blocks shared by the requests of one
// worker, and per-request sequences holding a block table.
//
// KvBlockPool is thread-safe. A PagedKvSequence is owned by one request and
// returns its blocks to the pool when destroyed.
#ifndef MOESH_COMMON_ENGINE_PAGED_KV_CACHE_H_
#define MOESH_COMMON_ENGINE_PAGED_KV_CACHE_H_

#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/model/kv_cache.h"

namespace moesh {

class PagedKvSequence;

class KvBlockPool {
 public:
  // Storage: num_blocks × [num_layers, block_size, row_width] float32.
  KvBlockPool(int num_layers, int row_width, int block_size, int num_blocks);

  int num_layers() const { return num_layers_; }
  int row_width() const { return row_width_; }
  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  int free_blocks() const;
  // Fraction of blocks in use, [0, 1].
  float usage() const;
  // Blocks needed for `tokens` tokens.
  int BlocksFor(int tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // A sequence able to hold `max_tokens` tokens, its blocks taken now.
  // RESOURCE_EXHAUSTED if fewer blocks are free.
  absl::StatusOr<std::unique_ptr<PagedKvSequence>> Allocate(int max_tokens);

 private:
  friend class PagedKvSequence;
  // Appends `n` free blocks to *blocks; RESOURCE_EXHAUSTED (taking none) if
  // fewer are free.
  absl::Status Take(int n, std::vector<int>* blocks);
  void Free(const std::vector<int>& blocks);
  float* Slot(int block, int layer, int slot) {
    return storage_.data() +
           ((static_cast<size_t>(block) * num_layers_ + layer) * block_size_ + slot) * row_width_;
  }

  const int num_layers_;
  const int row_width_;
  const int block_size_;
  const int num_blocks_;
  std::vector<float> storage_;  // blocks' rows; written only by their owner

  mutable absl::Mutex mu_;
  std::vector<int> free_ ABSL_GUARDED_BY(mu_);
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
  // Takes blocks from the pool until capacity() >= tokens.
  absl::Status Reserve(int tokens) override;
  void AppendRows(int layer, const float* src, int n) override;
  const float* Rows(int layer, std::vector<float>* scratch) const override;
  const std::vector<int>& block_table() const { return blocks_; }

 private:
  friend class KvBlockPool;
  PagedKvSequence(KvBlockPool* pool, std::vector<int> blocks)
      : pool_(pool), blocks_(std::move(blocks)), rows_(pool->num_layers(), 0) {}

  KvBlockPool* const pool_;
  std::vector<int> blocks_;  // grows (Reserve), never shrinks
  std::vector<int> rows_;    // rows written per layer
  int length_ = 0;
};

}  // namespace moesh

#endif  // MOESH_COMMON_ENGINE_PAGED_KV_CACHE_H_
