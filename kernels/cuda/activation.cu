// SiLU-and-mul: out = silu(gate) * up, with gate and up the halves of a row
// (clamped first where a limit is given: DeepSeek-V4's swiglu_limit).
#include <cmath>

#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"

namespace moesh::cuda {
namespace {

using rowwise::kThreads;
using rowwise::kVec;

__device__ __forceinline__ float SwiGlu(float g, float u, float limit) {
  if (limit > 0.0f) g = fminf(g, limit), u = fminf(fmaxf(u, -limit), limit);
  return g / (1.0f + expf(-g)) * u;
}

// Grid: (rows, column chunks). kVecIo: i and the pointers allow 16-byte accesses.
template <bool kVecIo>
__global__ void __launch_bounds__(kThreads)
    SiluAndMulKernel(const bf16* gate_up, bf16* out, int i, float limit) {
  PdlBegin();
  const int64_t row = blockIdx.x;
  const bf16* g = gate_up + row * 2 * i;
  const bf16* u = g + i;
  bf16* o = out + row * i;
  if constexpr (kVecIo) {
    const int j = (blockIdx.y * kThreads + threadIdx.x) * kVec;
    if (j >= i) return;
    const Bf16x8 gv = *reinterpret_cast<const Bf16x8*>(g + j);
    const Bf16x8 uv = *reinterpret_cast<const Bf16x8*>(u + j);
    Bf16x8 ov;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float2 a = __bfloat1622float2(gv.h[k]), b = __bfloat1622float2(uv.h[k]);
      ov.h[k] = __floats2bfloat162_rn(SwiGlu(a.x, b.x, limit), SwiGlu(a.y, b.y, limit));
    }
    *reinterpret_cast<Bf16x8*>(o + j) = ov;
  } else {
    const int j = blockIdx.y * kThreads + threadIdx.x;
    if (j >= i) return;
    o[j] = __float2bfloat16_rn(SwiGlu(__bfloat162float(g[j]), __bfloat162float(u[j]), limit));
  }
}

}  // namespace

absl::Status RunSiluAndMul(const SiluAndMulParams& p) {
  if (p.m < 0 || p.i <= 0) return absl::InvalidArgumentError("RunSiluAndMul: need m >= 0, i > 0");
  if (p.m == 0) return absl::OkStatus();
  if (!p.gate_up || !p.out) return absl::InvalidArgumentError("RunSiluAndMul: null pointer");
  const bool vec = p.i % kVec == 0 && (reinterpret_cast<uintptr_t>(p.gate_up) & 15) == 0 &&
                   (reinterpret_cast<uintptr_t>(p.out) & 15) == 0;
  if (vec) {
    const dim3 grid(p.m, (p.i / kVec + kThreads - 1) / kThreads);
    RETURN_IF_ERROR(LaunchPdl("SiluAndMulKernel", SiluAndMulKernel<true>, grid, kThreads, 0,
                              p.stream, p.gate_up, p.out, p.i, p.limit));
  } else {
    const dim3 grid(p.m, (p.i + kThreads - 1) / kThreads);
    RETURN_IF_ERROR(LaunchPdl("SiluAndMulKernel", SiluAndMulKernel<false>, grid, kThreads, 0,
                              p.stream, p.gate_up, p.out, p.i, p.limit));
  }
  return absl::OkStatus();
}

}  // namespace moesh::cuda
