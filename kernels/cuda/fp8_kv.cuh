// FlashMLA's FP8 KV row on the device (KvCacheDtype::kFp8): the arithmetic
// the KV write (rope.cu) and the MLA kernels (mla_decode_fp8.cu,
// model_ops.cu) share. The layout is cpu::Fp8KvRowLayout's and the reference
// cpu::PackFp8KvRow / UnpackFp8KvRow (kernels/cpu/fp8.h): the same float
// operations here, so the same scales and codes bit for bit (finite inputs).
#ifndef MOESH_KERNELS_CUDA_FP8_KV_CUH_
#define MOESH_KERNELS_CUDA_FP8_KV_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cpu/fp8.h"

namespace moesh::cuda::fp8kv {

// cpu::Fp8KvScale: the power of two at or above max(amax, 1e-4) / 448 (448's
// scale for a non-finite amax).
__device__ __forceinline__ float Scale(float amax) {
  const float a = isfinite(amax) ? fmaxf(amax, cpu::kFp8KvAmaxFloor) : cpu::kFp8Max;
  int e = 0;
  const float m = frexpf(a / cpu::kFp8Max, &e);
  return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

// e4m3(x / scale), round to nearest even, saturating (as F32ToF8E4M3; a
// NaN's code may differ in its sign bit, still NaN).
__device__ __forceinline__ uint8_t Code(float x, float scale) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float Decode(uint8_t code) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(code, __NV_E4M3);
  return __half2float(__half(h));
}

// Two codes (the lower byte first) as f16x2, exactly (every e4m3 value is an
// f16 normal or zero): one cvt on sm_89 and later.
__device__ __forceinline__ uint32_t CodesToF16x2(uint32_t two) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two & 0xFFFFu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
}

// Eight codes (two words, the lower byte first) times a power-of-two `scale`
// as four bf16 pairs, exactly: e4m3 -> f16 is exact, a power of two keeps it
// exact in fp32, and e4m3's three mantissa bits fit bf16's seven.
__device__ __forceinline__ uint4 WidenToBf16x8(uint2 codes, float scale) {
  uint32_t out[4];
#pragma unroll
  for (int p = 0; p < 4; ++p) {
    const uint32_t word = p < 2 ? codes.x : codes.y;
    const uint32_t h2 = CodesToF16x2(word >> (16 * (p % 2)));
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h2));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale, f.y * scale);
    out[p] = *reinterpret_cast<const uint32_t*>(&b);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// Value d of a row: d < latent, code times its group's scale; else the rope
// part's bf16.
__device__ __forceinline__ float Load(const uint8_t* row, int latent, int d) {
  if (d < latent) {
    return Decode(row[d]) * reinterpret_cast<const float*>(row + latent)[d / cpu::kFp8Block];
  }
  const int rope_offset = latent + 4 * cpu::Fp8Blocks(latent);
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row + rope_offset)[d - latent]);
}

}  // namespace moesh::cuda::fp8kv

#endif  // MOESH_KERNELS_CUDA_FP8_KV_CUH_
