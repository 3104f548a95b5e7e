#include "kernels/cpu/ops.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace moesh::cpu {

void Linear(const float* x, const float* w, float* y, int m, int n, int k, bool accumulate, int ldx,
            int ldy) {
  if (m == 0 || n == 0) return;
  if (!ldx) ldx = k;
  if (!ldy) ldy = n;
  constexpr int kT = kLinearTileRows;
  const float beta = accumulate ? 1.0f : 0.0f;
  int r = 0;
  for (; r + kT <= m; r += kT) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kT, n, k, 1.0f,
                x + static_cast<int64_t>(r) * ldx, ldx, w, k, beta,
                y + static_cast<int64_t>(r) * ldy, ldy);
  }
  if (r == m) return;
  // The last rows, padded to a full tile so they take the same kernel path.
  const int rows = m - r;
  thread_local std::vector<float> xs, ys;
  xs.assign(static_cast<size_t>(kT) * k, 0.0f);
  ys.assign(static_cast<size_t>(kT) * n, 0.0f);
  for (int i = 0; i < rows; ++i) {
    std::copy_n(x + static_cast<int64_t>(r + i) * ldx, k, xs.data() + static_cast<size_t>(i) * k);
    if (accumulate)
      std::copy_n(y + static_cast<int64_t>(r + i) * ldy, n, ys.data() + static_cast<size_t>(i) * n);
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kT, n, k, 1.0f, xs.data(), k, w, k, beta,
              ys.data(), n);
  for (int i = 0; i < rows; ++i) {
    std::copy_n(ys.data() + static_cast<size_t>(i) * n, n, y + static_cast<int64_t>(r + i) * ldy);
  }
}

void RmsNorm(const float* x, const float* weight, float* y, int rows, int n, float eps, int ldx,
             int ldy) {
  if (!ldx) ldx = n;
  if (!ldy) ldy = n;
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * ldx;
    float* yr = y + static_cast<int64_t>(r) * ldy;
    float ss = 0.0f;
    for (int i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (int i = 0; i < n; ++i) yr[i] = weight[i] * (xr[i] * inv);
  }
}

void LayerNorm(const float* x, const float* weight, const float* bias, float* y, int rows, int n,
               float eps, int ldx, int ldy) {
  if (!ldx) ldx = n;
  if (!ldy) ldy = n;
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<int64_t>(r) * ldx;
    float* yr = y + static_cast<int64_t>(r) * ldy;
    double sum = 0.0;
    for (int i = 0; i < n; ++i) sum += xr[i];
    const double mean = sum / n;
    double var = 0.0;
    for (int i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    const float inv = static_cast<float>(1.0 / std::sqrt(var / n + eps));
    const float m = static_cast<float>(mean);
    for (int i = 0; i < n; ++i) yr[i] = (xr[i] - m) * inv * weight[i] + bias[i];
  }
}

void SiluAndMul(const float* gate_up, float* out, int m, int i, float limit) {
  for (int r = 0; r < m; ++r) {
    const float* g = gate_up + static_cast<int64_t>(r) * 2 * i;
    const float* u = g + i;
    float* o = out + static_cast<int64_t>(r) * i;
    if (limit > 0.0f) {
      for (int j = 0; j < i; ++j) {
        const float gj = std::min(g[j], limit);
        o[j] = gj / (1.0f + std::exp(-gj)) * std::clamp(u[j], -limit, limit);
      }
      continue;
    }
    for (int j = 0; j < i; ++j) o[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
  }
}

void SoftmaxRows(float* x, int rows, int n) {
  for (int r = 0; r < rows; ++r) {
    float* xr = x + static_cast<int64_t>(r) * n;
    const float mx = *std::max_element(xr, xr + n);
    float sum = 0.0f;
    for (int i = 0; i < n; ++i) {
      xr[i] = std::exp(xr[i] - mx);
      sum += xr[i];
    }
    const float inv = 1.0f / sum;
    for (int i = 0; i < n; ++i) xr[i] *= inv;
  }
}

void LogSoftmax(const float* x, float* out, int n) {
  const float mx = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - mx);
  const double lse = mx + std::log(sum);
  for (int i = 0; i < n; ++i) out[i] = static_cast<float>(x[i] - lse);
}

void Axpy(float alpha, const float* x, float* y, int n) { cblas_saxpy(n, alpha, x, 1, y, 1); }

}  // namespace moesh::cpu
