// Elementwise and dense CPU ops: the reference backend's building blocks.
//
// All tensors are row-major float32. Thread-safe: pure functions (GEMMs run
// on OpenBLAS's own thread pool).
#ifndef MOESH_KERNELS_CPU_OPS_H_
#define MOESH_KERNELS_CPU_OPS_H_

#include <cstdint>

namespace moesh::cpu {

// y[m, n] = x[m, k] · w[n, k]^T (+ y if accumulate): nn.Linear's layout.
// ldx / ldy are row strides in elements (0: k / n).
// Batch-invariant: a row's result is bitwise the same whatever m and the other
// rows are (OpenBLAS alone is not: it picks kernels by m), so a request's
// tokens do not depend on what it was batched with. Rows go through the BLAS
// in tiles of exactly kLinearTileRows, the last one zero-padded.
constexpr int kLinearTileRows = 8;
void Linear(const float* x, const float* w, float* y, int m, int n, int k, bool accumulate = false,
            int ldx = 0, int ldy = 0);

// y[rows, n] = x * rsqrt(mean(x^2) + eps) * weight[n]. x and y may alias.
void RmsNorm(const float* x, const float* weight, float* y, int rows, int n, float eps, int ldx = 0,
             int ldy = 0);

// y[rows, n] = (x - mean(x)) * rsqrt(var(x) + eps) * weight[n] + bias[n]
// (nn.LayerNorm; biased variance). x and y may alias.
void LayerNorm(const float* x, const float* weight, const float* bias, float* y, int rows, int n,
               float eps, int ldx = 0, int ldy = 0);

// out[m, i] = silu(gate_up[m, :i]) * gate_up[m, i:2i]. limit > 0 clamps
// first (DeepSeek-V4's swiglu_limit): gate to <= limit, up to [-limit, limit].
void SiluAndMul(const float* gate_up, float* out, int m, int i, float limit = 0.0f);

// In-place softmax over each row of x[rows, n] (max-subtracted).
void SoftmaxRows(float* x, int rows, int n);

// out[n] = log_softmax(x[n]), computed in double for the normaliser.
void LogSoftmax(const float* x, float* out, int n);

// y[n] += alpha * x[n].
void Axpy(float alpha, const float* x, float* y, int n);

}  // namespace moesh::cpu

#endif  // MOESH_KERNELS_CPU_OPS_H_
