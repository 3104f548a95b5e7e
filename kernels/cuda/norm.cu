// RMSNorm, plain and fused with the residual add: one CTA per row.
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"

namespace moesh::cuda {
namespace {

using rowwise::kThreads;
using rowwise::kVec;

// kVecIo: rows, weight and n allow 16-byte accesses.
template <bool kVecIo, bool kResidual>
__global__ void __launch_bounds__(kThreads)
    RmsNormKernel(bf16* x, const bf16* residual, const bf16* weight, bf16* y, int n, int ldx,
                  int ldr, int ldy, float eps) {
  PdlBegin();
  __shared__ float scratch[32];
  const int64_t row = blockIdx.x;
  bf16* xr = x + row * ldx;
  bf16* yr = y + row * ldy;
  float ss = 0.0f;
  // Pass 1: sum of squares (and the residual add, written back rounded; the
  // norm below reads those rounded values, as an unfused add then norm would).
  if constexpr (kVecIo) {
    for (int i = threadIdx.x * kVec; i < n; i += kThreads * kVec) {
      Bf16x8 v = *reinterpret_cast<const Bf16x8*>(xr + i);
      if constexpr (kResidual) {
        const Bf16x8 r = *reinterpret_cast<const Bf16x8*>(residual + row * ldr + i);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 a = __bfloat1622float2(v.h[j]), b = __bfloat1622float2(r.h[j]);
          v.h[j] = __floats2bfloat162_rn(a.x + b.x, a.y + b.y);
        }
        *reinterpret_cast<Bf16x8*>(xr + i) = v;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 a = __bfloat1622float2(v.h[j]);
        ss += a.x * a.x + a.y * a.y;
      }
    }
  } else {
    for (int i = threadIdx.x; i < n; i += kThreads) {
      float a = __bfloat162float(xr[i]);
      if constexpr (kResidual) {
        const bf16 s = __float2bfloat16_rn(a + __bfloat162float(residual[row * ldr + i]));
        xr[i] = s;
        a = __bfloat162float(s);
      }
      ss += a * a;
    }
  }
  const float inv = rsqrtf(BlockSum(ss, scratch) / static_cast<float>(n) + eps);
  // Pass 2: each thread re-reads the elements it read (and wrote) in pass 1.
  if constexpr (kVecIo) {
    for (int i = threadIdx.x * kVec; i < n; i += kThreads * kVec) {
      const Bf16x8 v = *reinterpret_cast<const Bf16x8*>(xr + i);
      const Bf16x8 w = *reinterpret_cast<const Bf16x8*>(weight + i);
      Bf16x8 o;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 a = __bfloat1622float2(v.h[j]), b = __bfloat1622float2(w.h[j]);
        o.h[j] = __floats2bfloat162_rn(b.x * (a.x * inv), b.y * (a.y * inv));
      }
      *reinterpret_cast<Bf16x8*>(yr + i) = o;
    }
  } else {
    for (int i = threadIdx.x; i < n; i += kThreads) {
      yr[i] = __float2bfloat16_rn(__bfloat162float(weight[i]) * (__bfloat162float(xr[i]) * inv));
    }
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <bool kResidual>
absl::Status Launch(bf16* x, const bf16* residual, const bf16* weight, bf16* y, int rows, int n,
                    int ldx, int ldr, int ldy, float eps, cudaStream_t stream) {
  if (rows == 0) return absl::OkStatus();
  const bool vec = n % kVec == 0 && ldx % kVec == 0 && ldy % kVec == 0 &&
                   (!kResidual || ldr % kVec == 0) && Aligned16(x) && Aligned16(y) &&
                   Aligned16(weight) && (!kResidual || Aligned16(residual));
  if (vec) {
    RETURN_IF_ERROR(LaunchPdl("RmsNormKernel", RmsNormKernel<true, kResidual>, rows, kThreads, 0,
                              stream, x, residual, weight, y, n, ldx, ldr, ldy, eps));
  } else {
    RETURN_IF_ERROR(LaunchPdl("RmsNormKernel", RmsNormKernel<false, kResidual>, rows, kThreads, 0,
                              stream, x, residual, weight, y, n, ldx, ldr, ldy, eps));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunRmsNorm(const RmsNormParams& p) {
  const int ldx = p.ldx ? p.ldx : p.n, ldy = p.ldy ? p.ldy : p.n;
  if (p.rows < 0 || p.n <= 0 || ldx < p.n || ldy < p.n) {
    return absl::InvalidArgumentError("RunRmsNorm: need rows >= 0, n > 0, ldx/ldy >= n");
  }
  if (p.rows > 0 && (!p.x || !p.weight || !p.y))
    return absl::InvalidArgumentError("RunRmsNorm: null pointer");
  return Launch<false>(const_cast<bf16*>(p.x), nullptr, p.weight, p.y, p.rows, p.n, ldx, 0, ldy,
                       p.eps, p.stream);
}

absl::Status RunAddRmsNorm(const AddRmsNormParams& p) {
  const int ldx = p.ldx ? p.ldx : p.n, ldr = p.ld_residual ? p.ld_residual : p.n,
            ldy = p.ldy ? p.ldy : p.n;
  if (p.rows < 0 || p.n <= 0 || ldx < p.n || ldr < p.n || ldy < p.n) {
    return absl::InvalidArgumentError("RunAddRmsNorm: need rows >= 0, n > 0, strides >= n");
  }
  if (p.rows > 0 && (!p.x || !p.residual || !p.weight || !p.y)) {
    return absl::InvalidArgumentError("RunAddRmsNorm: null pointer");
  }
  if (p.y == p.x || p.y == p.residual)
    return absl::InvalidArgumentError("RunAddRmsNorm: y aliases an input");
  return Launch<true>(p.x, p.residual, p.weight, p.y, p.rows, p.n, ldx, ldr, ldy, p.eps, p.stream);
}

}  // namespace moesh::cuda
