#include "common/engine/paged_kv_cache.h"

#include <algorithm>
#include <cstring>

#include "base/status.h"

namespace moesh {

KvBlockPool::KvBlockPool(int num_layers, int row_width, int block_size, int num_blocks,
                         bool prefix_cache, KvRowFormat format)
    : num_layers_(num_layers),
      row_width_(row_width),
      format_(format),
      blocks_(block_size, num_blocks, prefix_cache),
      storage_(static_cast<size_t>(num_blocks) * num_layers * block_size * row_width) {}

absl::StatusOr<std::unique_ptr<PagedKvSequence>> KvBlockPool::Allocate(
    int max_tokens, absl::Span<const int32_t> prefix) {
  ASSIGN_OR_RETURN(KvBlockRun run, blocks_.Allocate(max_tokens, prefix));
  std::unique_ptr<PagedKvSequence> seq(new PagedKvSequence(this, std::move(run.blocks)));
  std::fill(seq->rows_.begin(), seq->rows_.end(), run.cached_tokens);
  seq->length_ = run.cached_tokens;
  seq->cached_tokens_ = run.cached_tokens;
  seq->hashes_ = std::move(run.hashes);
  return seq;
}

absl::Status PagedKvSequence::Reserve(int tokens) {
  const int need = pool_->BlocksFor(tokens) - static_cast<int>(blocks_.size());
  return need > 0 ? pool_->blocks_.Take(need, &blocks_) : absl::OkStatus();
}

void PagedKvSequence::AppendRows(int layer, const float* src, int n) {
  const int bs = pool_->block_size();
  const int w = pool_->row_width();
  for (int i = 0; i < n; ++i) {
    const int t = rows_[layer] + i;
    float* slot = pool_->Slot(blocks_[t / bs], layer, t % bs);
    std::memcpy(slot, src + static_cast<size_t>(i) * w, w * sizeof(float));
    pool_->format_.Apply(slot, 1, w);
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

void PagedKvSequence::PublishPrefix(absl::Span<const int32_t> tokens) {
  pool_->blocks_.PublishPrefix(blocks_, length_, tokens, &hashes_);
}

}  // namespace moesh
