#include "kernels/cpu/dsa_indexer.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

namespace moesh::cpu {

void RunDsaIndexer(const DsaIndexerParams& p) {
  const int d = p.head_dim;
  std::memset(p.mask, 0, static_cast<size_t>(p.num_q) * p.num_kv);
  std::vector<float> dots(static_cast<size_t>(p.num_q) * p.num_kv);
  std::vector<float> index(static_cast<size_t>(p.num_q) * p.num_kv, 0.0f);
  for (int h = 0; h < p.num_heads; ++h) {
    // dots[num_q, num_kv] = q_h[num_q, d] . k[num_kv, d]^T
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, p.num_q, p.num_kv, d, 1.0f,
                p.q + static_cast<int64_t>(h) * d, p.num_heads * d, p.k, p.k_row_stride, 0.0f,
                dots.data(), p.num_kv);
    for (int i = 0; i < p.num_q; ++i) {
      const float w = p.weights[static_cast<int64_t>(i) * p.num_heads + h];
      const float* drow = dots.data() + static_cast<int64_t>(i) * p.num_kv;
      float* irow = index.data() + static_cast<int64_t>(i) * p.num_kv;
      const int visible = p.q_start_pos + i + 1;
      for (int j = 0; j < visible; ++j) irow[j] += w * std::max(drow[j] * p.softmax_scale, 0.0f);
    }
  }
  std::vector<int> order(p.num_kv);
  for (int i = 0; i < p.num_q; ++i) {
    uint8_t* keep = p.mask + static_cast<int64_t>(i) * p.num_kv;
    const int visible = p.q_start_pos + i + 1;
    if (visible <= p.top_k) {
      std::memset(keep, 1, visible);
      continue;
    }
    const float* irow = index.data() + static_cast<int64_t>(i) * p.num_kv;
    std::iota(order.begin(), order.begin() + visible, 0);
    std::nth_element(
        order.begin(), order.begin() + (p.top_k - 1), order.begin() + visible,
        [irow](int a, int b) { return irow[a] > irow[b] || (irow[a] == irow[b] && a < b); });
    for (int t = 0; t < p.top_k; ++t) keep[order[t]] = 1;
  }
}

}  // namespace moesh::cpu
