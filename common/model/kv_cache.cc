#include "common/model/kv_cache.h"

#include <algorithm>

namespace moesh {

void SequenceKvCache::AppendRows(int layer, const float* src, int n) {
  std::vector<float>& rows = layers_[layer];
  rows.insert(rows.end(), src, src + static_cast<size_t>(n) * row_width_);
  if (layer + 1 == static_cast<int>(layers_.size()))
    length_ = static_cast<int>(rows.size()) / row_width_;
}

void SequenceKvCache::Truncate(int n) {
  n = std::min(n, length_);
  for (auto& rows : layers_)
    rows.resize(std::min(rows.size(), static_cast<size_t>(n) * row_width_));
  length_ = n;
}

}  // namespace moesh
