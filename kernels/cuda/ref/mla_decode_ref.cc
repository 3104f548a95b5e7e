#include "kernels/cuda/ref/mla_decode_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace moesh::cuda::ref {

void MlaDecodeRef(const MlaDecodeRefParams& p) {
  const int dim = p.kv_lora_rank + p.rope_dim;
  std::vector<double> scores, acc(p.kv_lora_rank);
  for (int b = 0; b < p.batch; ++b) {
    const int len = p.seq_lens[b];
    std::vector<const float*> rows(len);
    for (int t = 0; t < len; ++t) {
      const int block =
          p.block_table[static_cast<int64_t>(b) * p.max_blocks_per_seq + t / p.block_size];
      rows[t] = p.kv_cache + (static_cast<int64_t>(block) * p.block_size + t % p.block_size) * dim;
    }
    for (int h = 0; h < p.num_heads; ++h) {
      const float* q = p.q + (static_cast<int64_t>(b) * p.num_heads + h) * dim;
      float* out = p.out + (static_cast<int64_t>(b) * p.num_heads + h) * p.kv_lora_rank;
      scores.assign(len, 0.0);
      double mx = -std::numeric_limits<double>::infinity();
      for (int t = 0; t < len; ++t) {
        double s = 0.0;
        for (int d = 0; d < dim; ++d) s += static_cast<double>(q[d]) * rows[t][d];
        scores[t] = s * p.softmax_scale;
        mx = std::max(mx, scores[t]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int t = 0; t < len; ++t) {
        const double w = std::exp(scores[t] - mx);
        sum += w;
        for (int d = 0; d < p.kv_lora_rank; ++d) acc[d] += w * rows[t][d];
      }
      for (int d = 0; d < p.kv_lora_rank; ++d)
        out[d] = len > 0 ? static_cast<float>(acc[d] / sum) : 0.0f;
      if (p.lse != nullptr) {
        p.lse[static_cast<int64_t>(b) * p.num_heads + h] =
            len > 0 ? static_cast<float>(mx + std::log(sum))
                    : -std::numeric_limits<float>::infinity();
      }
    }
  }
}

}  // namespace moesh::cuda::ref
