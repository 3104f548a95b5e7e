#include "common/engine/paged_kv_cache.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace moesh {

KvBlockPool::KvBlockPool(int num_layers, int row_width, int block_size, int num_blocks)
    : num_layers_(num_layers),
      row_width_(row_width),
      block_size_(block_size),
      num_blocks_(num_blocks),
      storage_(static_cast<size_t>(num_blocks) * num_layers * block_size * row_width) {
  // Lowest ids are handed out first.
  for (int b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

int KvBlockPool::free_blocks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(free_.size());
}

float KvBlockPool::usage() const {
  absl::MutexLock lock(&mu_);
  return num_blocks_ == 0 ? 0.0f : 1.0f - static_cast<float>(free_.size()) / num_blocks_;
}

absl::StatusOr<std::unique_ptr<PagedKvSequence>> KvBlockPool::Allocate(int max_tokens) {
  std::vector<int> blocks;
  if (absl::Status s = Take(BlocksFor(std::max(max_tokens, 1)), &blocks); !s.ok()) return s;
  return std::unique_ptr<PagedKvSequence>(new PagedKvSequence(this, std::move(blocks)));
}

absl::Status KvBlockPool::Take(int n, std::vector<int>* blocks) {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(free_.size()) < n) {
    return absl::ResourceExhaustedError(absl::StrCat("KV cache full: need ", n, " blocks of ",
                                                     block_size_, " tokens, ", free_.size(), " of ",
                                                     num_blocks_, " free"));
  }
  blocks->insert(blocks->end(), free_.end() - n, free_.end());
  free_.resize(free_.size() - n);
  return absl::OkStatus();
}

void KvBlockPool::Free(const std::vector<int>& blocks) {
  absl::MutexLock lock(&mu_);
  free_.insert(free_.end(), blocks.begin(), blocks.end());
}

absl::Status PagedKvSequence::Reserve(int tokens) {
  const int need = pool_->BlocksFor(tokens) - static_cast<int>(blocks_.size());
  return need > 0 ? pool_->Take(need, &blocks_) : absl::OkStatus();
}

void PagedKvSequence::AppendRows(int layer, const float* src, int n) {
  const int bs = pool_->block_size();
  const int w = pool_->row_width();
  for (int i = 0; i < n; ++i) {
    const int t = rows_[layer] + i;
    std::memcpy(pool_->Slot(blocks_[t / bs], layer, t % bs), src + static_cast<size_t>(i) * w,
                w * sizeof(float));
  }
  rows_[layer] += n;
  if (layer + 1 == pool_->num_layers()) length_ = rows_[layer];
}

const float* PagedKvSequence::Rows(int layer, std::vector<float>* scratch) const {
  const int bs = pool_->block_size();
  const int w = pool_->row_width();
  const int n = rows_[layer];
  scratch->resize(static_cast<size_t>(n) * w);
  for (int start = 0; start < n; start += bs) {
    const int count = std::min(bs, n - start);
    std::memcpy(scratch->data() + static_cast<size_t>(start) * w,
                pool_->Slot(blocks_[start / bs], layer, 0),
                static_cast<size_t>(count) * w * sizeof(float));
  }
  return scratch->data();
}

}  // namespace moesh
