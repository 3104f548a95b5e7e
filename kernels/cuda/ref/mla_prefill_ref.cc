#include "kernels/cuda/ref/mla_prefill_ref.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace moesh::cuda::ref {

void MlaPrefillRef(const MlaPrefillRefParams& p) {
  const int qk = p.nope_dim + p.rope_dim;
  std::vector<double> scores, acc(p.v_dim);
  for (int i = 0; i < p.num_q; ++i) {
    // Keys [0, seen) are at positions <= the query's.
    const int64_t limit = static_cast<int64_t>(p.q_pos0) + i - p.k_pos0 + 1;
    const int seen = static_cast<int>(std::clamp<int64_t>(limit, 0, p.num_k));
    for (int h = 0; h < p.num_heads; ++h) {
      const float* q = p.q + (static_cast<int64_t>(i) * p.num_heads + h) * qk;
      float* out = p.out + (static_cast<int64_t>(i) * p.num_heads + h) * p.v_dim;
      scores.assign(seen, 0.0);
      double mx = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < seen; ++j) {
        const float* kn = p.k_nope + (static_cast<int64_t>(j) * p.num_heads + h) * p.nope_dim;
        const float* kp = p.k_pe + static_cast<int64_t>(j) * p.rope_dim;
        double s = 0.0;
        for (int d = 0; d < p.nope_dim; ++d) s += static_cast<double>(q[d]) * kn[d];
        for (int d = 0; d < p.rope_dim; ++d) s += static_cast<double>(q[p.nope_dim + d]) * kp[d];
        scores[j] = s * p.softmax_scale;
        mx = std::max(mx, scores[j]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double sum = 0.0;
      for (int j = 0; j < seen; ++j) {
        const double e = std::exp(scores[j] - mx);
        sum += e;
        const float* v = p.v + (static_cast<int64_t>(j) * p.num_heads + h) * p.v_dim;
        for (int d = 0; d < p.v_dim; ++d) acc[d] += e * v[d];
      }
      for (int d = 0; d < p.v_dim; ++d) out[d] = seen > 0 ? static_cast<float>(acc[d] / sum) : 0.0f;
      if (p.lse != nullptr) {
        p.lse[static_cast<int64_t>(i) * p.num_heads + h] =
            seen > 0 ? static_cast<float>(mx + std::log(sum))
                     : -std::numeric_limits<float>::infinity();
      }
    }
  }
}

}  // namespace moesh::cuda::ref
