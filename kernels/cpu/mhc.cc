#include "kernels/cpu/mhc.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.h"

namespace moesh::cpu {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// mixes[num_tokens, n_out] = fn · rmsnorm(x_t flattened), unweighted.
std::vector<float> Mixes(const float* x, int num_tokens, int width, const float* fn, int n_out,
                         float eps) {
  std::vector<float> flat(static_cast<size_t>(num_tokens) * width);
  const std::vector<float> ones(width, 1.0f);
  RmsNorm(x, ones.data(), flat.data(), num_tokens, width, eps);
  std::vector<float> mixes(static_cast<size_t>(num_tokens) * n_out);
  Linear(flat.data(), fn, mixes.data(), num_tokens, n_out, width);
  return mixes;
}

// out[hidden] = sum_j pre[j] * x[j, :]
void Collapse(const float* x, const float* pre, int hc, int hidden, float* out) {
  std::fill(out, out + hidden, 0.0f);
  for (int j = 0; j < hc; ++j) {
    for (int d = 0; d < hidden; ++d) out[d] += pre[j] * x[static_cast<int64_t>(j) * hidden + d];
  }
}

}  // namespace

void RunMhcPre(const MhcPreParams& p) {
  const int hc = p.hc;
  const int mix = (2 + hc) * hc;
  const std::vector<float> mixes = Mixes(p.x, p.num_tokens, hc * p.hidden, p.fn, mix, p.norm_eps);
  std::vector<float> pre(hc);
  for (int t = 0; t < p.num_tokens; ++t) {
    const float* m = mixes.data() + static_cast<int64_t>(t) * mix;
    float* post = p.post + static_cast<int64_t>(t) * hc;
    float* comb = p.comb + static_cast<int64_t>(t) * hc * hc;
    for (int j = 0; j < hc; ++j) {
      pre[j] = Sigmoid(m[j] * p.scale[0] + p.base[j]) + p.hc_eps;
      post[j] = 2.0f * Sigmoid(m[hc + j] * p.scale[1] + p.base[hc + j]);
    }
    for (int j = 0; j < hc; ++j) {
      float* row = comb + static_cast<int64_t>(j) * hc;
      for (int k = 0; k < hc; ++k)
        row[k] = m[2 * hc + j * hc + k] * p.scale[2] + p.base[2 * hc + j * hc + k];
      SoftmaxRows(row, 1, hc);
      for (int k = 0; k < hc; ++k) row[k] += p.hc_eps;
    }
    auto normalize_columns = [&] {
      for (int k = 0; k < hc; ++k) {
        float sum = 0.0f;
        for (int j = 0; j < hc; ++j) sum += comb[j * hc + k];
        for (int j = 0; j < hc; ++j) comb[j * hc + k] /= sum + p.hc_eps;
      }
    };
    normalize_columns();
    for (int it = 1; it < p.sinkhorn_iters; ++it) {
      for (int j = 0; j < hc; ++j) {
        float sum = 0.0f;
        for (int k = 0; k < hc; ++k) sum += comb[j * hc + k];
        for (int k = 0; k < hc; ++k) comb[j * hc + k] /= sum + p.hc_eps;
      }
      normalize_columns();
    }
    Collapse(p.x + static_cast<int64_t>(t) * hc * p.hidden, pre.data(), hc, p.hidden,
             p.collapsed + static_cast<int64_t>(t) * p.hidden);
  }
}

void RunMhcPost(float* x, const float* y, const float* post, const float* comb, int num_tokens,
                int hc, int hidden) {
  std::vector<float> mixed(static_cast<size_t>(hc) * hidden);
  for (int t = 0; t < num_tokens; ++t) {
    float* xt = x + static_cast<int64_t>(t) * hc * hidden;
    const float* yt = y + static_cast<int64_t>(t) * hidden;
    const float* pt = post + static_cast<int64_t>(t) * hc;
    const float* ct = comb + static_cast<int64_t>(t) * hc * hc;
    for (int k = 0; k < hc; ++k) {
      float* out = mixed.data() + static_cast<int64_t>(k) * hidden;
      for (int d = 0; d < hidden; ++d) out[d] = pt[k] * yt[d];
      for (int j = 0; j < hc; ++j) {
        const float w = ct[j * hc + k];
        const float* xj = xt + static_cast<int64_t>(j) * hidden;
        for (int d = 0; d < hidden; ++d) out[d] += w * xj[d];
      }
    }
    std::memcpy(xt, mixed.data(), mixed.size() * sizeof(float));
  }
}

void RunMhcHead(const MhcHeadParams& p) {
  const int hc = p.hc;
  const std::vector<float> mixes = Mixes(p.x, p.num_tokens, hc * p.hidden, p.fn, hc, p.norm_eps);
  std::vector<float> pre(hc);
  for (int t = 0; t < p.num_tokens; ++t) {
    for (int j = 0; j < hc; ++j)
      pre[j] = Sigmoid(mixes[static_cast<int64_t>(t) * hc + j] * p.scale[0] + p.base[j]) + p.hc_eps;
    Collapse(p.x + static_cast<int64_t>(t) * hc * p.hidden, pre.data(), hc, p.hidden,
             p.out + static_cast<int64_t>(t) * p.hidden);
  }
}

}  // namespace moesh::cpu
