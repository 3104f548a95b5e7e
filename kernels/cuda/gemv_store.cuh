// The tensor-core GEMVs' end (fp8_gemv.cu, bf16_gemv.cu): a CTA of kWarps
// warps, each holding an mma.m16n8 accumulator over its share of k, adds the
// warps' sums in shared memory and writes them. Thread (g, tq) of warp 0
// holds weight rows r_lo = row0 + g and r_hi = r_lo + 8 (the MMA's M) of
// activation rows 2 tq and 2 tq + 1 (its N): acc[e] is row (e < 2 ? r_lo :
// r_hi) of activation row 2 tq + (e & 1). Outputs land at y + t * ldy + row
// (float32 or bf16, added to what is there when accumulate); rows past n and
// activation rows past m are not written. Every thread of the CTA calls it.
#ifndef MOESH_KERNELS_CUDA_GEMV_STORE_CUH_
#define MOESH_KERNELS_CUDA_GEMV_STORE_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/params.h"

namespace moesh::cuda {

template <int kWarps>
__device__ __forceinline__ void GemvReduceStore(float (&part)[kWarps][32][4], const float (&acc)[4],
                                                void* y, int ldy, int r_lo, int n, int m,
                                                OutType out_type, bool accumulate) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, tq = lane & 3;
#pragma unroll
  for (int e = 0; e < 4; ++e) part[warp][lane][e] = acc[e];
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    float v = part[0][lane][e];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) v += part[w][lane][e];
    const int row = e < 2 ? r_lo : r_lo + 8, t = 2 * tq + (e & 1);
    if (row >= n || t >= m) continue;
    const int64_t at = static_cast<int64_t>(t) * ldy + row;
    if (out_type == OutType::kFloat32) {
      float* dst = static_cast<float*>(y) + at;
      *dst = accumulate ? *dst + v : v;
    } else {
      __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(y) + at;
      *dst = __float2bfloat16_rn(accumulate ? __bfloat162float(*dst) + v : v);
    }
  }
}

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_GEMV_STORE_CUH_
