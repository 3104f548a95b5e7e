// Launch helpers shared by the .cu files: runtime -> compile-time dispatch
// and small device utilities.
#ifndef MOESH_KERNELS_CUDA_LAUNCH_CUH_
#define MOESH_KERNELS_CUDA_LAUNCH_CUH_

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

namespace moesh::cuda {

// Runtime -> compile-time dispatch (DeepEP's launch.cuh idea): calls
// f(std::integral_constant<int, C>{}) for C the smallest of the ascending
// kCandidates with value <= C. Returns false, calling nothing, if none is.
template <int... kCandidates, typename F>
bool DispatchUpTo(int value, F&& f) {
  bool done = false;
  ((done = done || (value <= kCandidates && (f(std::integral_constant<int, kCandidates>{}), true))),
   ...);
  return done;
}

}  // namespace moesh::cuda

namespace moesh::cuda {

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds >= 32 floats.
// REQUIRES: blockDim.x is a multiple of 32; every thread calls it.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();  // scratch may still be read by an earlier call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int nwarps = blockDim.x >> 5;
  v = lane < nwarps ? scratch[lane] : 0.0f;
  return WarpSum(v);
}

// True iff (va, ia) ranks before (vb, ib): larger value, then lower index.
__device__ __forceinline__ bool Better(float va, int ia, float vb, int ib) {
  return va > vb || (va == vb && ia < ib);
}

// Warp-wide best (v, i) by Better(); every lane gets it.
__device__ __forceinline__ void WarpArgBest(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (Better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// 16 bytes of bf16.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_LAUNCH_CUH_
