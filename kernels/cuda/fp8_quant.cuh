// DeepSeek's activation / weight quantization on the device (a scale per
// 128-value block): the arithmetic RunQuantizeFp8, RunQuantizeFp8Blocks
// (fp8.cu) and the FP8 GEMV's own quantization (fp8_gemv.cu) share, so that
// they write the same scales and codes as kernels/cpu/fp8.h's reference, bit
// for bit.
#ifndef MOESH_KERNELS_CUDA_FP8_QUANT_CUH_
#define MOESH_KERNELS_CUDA_FP8_QUANT_CUH_

#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cpu/fp8.h"

namespace moesh::cuda::fp8q {

// A block's scale from its max |x|: max(amax, kFp8MinAmax) / 448, IEEE
// division as the reference.
__device__ __forceinline__ float BlockScale(float amax) {
  return fmaxf(amax, cpu::kFp8MinAmax) / cpu::kFp8Max;
}

// The e4m3 code of v / scale, saturated to the finite range.
__device__ __forceinline__ uint32_t Code(float v, float scale) {
  return __nv_cvt_float_to_fp8(v / scale, __NV_SATFINITE, __NV_E4M3);
}

}  // namespace moesh::cuda::fp8q

#endif  // MOESH_KERNELS_CUDA_FP8_QUANT_CUH_
