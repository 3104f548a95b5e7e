#include "common/model/kv_cache.h"

#include <algorithm>

#include "common/model/config.h"
#include "kernels/cpu/fp8.h"

namespace moesh {

KvRowFormat KvRowFormat::Fp8(const ModelConfig& config) {
  KvRowFormat f;
  f.fp8_latent = config.kv_lora_rank;
  f.fp8_rope = config.qk_rope_head_dim;
  return f;
}

void KvRowFormat::Apply(float* rows, int n, int width) const {
  if (!fp8()) return;
  for (int i = 0; i < n; ++i)
    cpu::RoundTripFp8KvRow(rows + static_cast<size_t>(i) * width, fp8_latent, fp8_rope);
}

void SequenceKvCache::AppendRows(int layer, const float* src, int n) {
  std::vector<float>& rows = layers_[layer];
  const size_t start = rows.size();
  rows.insert(rows.end(), src, src + static_cast<size_t>(n) * row_width_);
  format_.Apply(rows.data() + start, n, row_width_);
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
