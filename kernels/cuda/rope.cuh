// RoPE's device arithmetic, shared by the kernels that rotate (rope.cu,
// model/v4_ops.cu, model/dsa_ops.cu). As kernels/cpu/rope.cc RunRope:
// angle = inv_freq[i] * position in fp32, (cos, sin) scaled by
// attention_factor, the pair rotated in fp32; a negative position undoes a
// rotation.
#ifndef MOESH_KERNELS_CUDA_ROPE_CUH_
#define MOESH_KERNELS_CUDA_ROPE_CUH_

#include <cuda_runtime.h>

namespace moesh::cuda {

// (cos, sin) of pair i at `position`.
__device__ __forceinline__ float2 RopeCosSin(const float* inv_freq, float attention_factor, int i,
                                             int position) {
  float s, c;
  sincosf(inv_freq[i] * static_cast<float>(position), &s, &c);
  return make_float2(c * attention_factor, s * attention_factor);
}

// The pair (x0, x1) rotated by cs = (cos, sin).
__device__ __forceinline__ float2 RopeRotate(float2 v, float2 cs) {
  return make_float2(v.x * cs.x - v.y * cs.y, v.y * cs.x + v.x * cs.y);
}

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_ROPE_CUH_
