// Warp-level tensor-core PTX wrappers shared by the mma.sync kernels (MLA
// decode and prefill, the MoE grouped GEMM, the indexer): shared-memory
// addressing and swizzle, bf16 fragment packing, ldmatrix / stmatrix and the
// m16n8k16 bf16 and f16 and m16n8k32 e4m3 MMAs with fp32 accumulation.
#ifndef MOESH_KERNELS_CUDA_MMA_CUH_
#define MOESH_KERNELS_CUDA_MMA_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace moesh::cuda {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Element offset of 16-byte chunk c (8 bf16) of row r in a shared-memory tile
// of row_elems bf16 a row whose chunks are XOR-swizzled by row (chunk c at
// c ^ (r & 7)): the eight rows an ldmatrix reads fall in eight bank groups.
// REQUIRES: row_elems / 8 a multiple of 8 (the swizzle stays in the row).
__device__ __forceinline__ int SwizzledChunk(int r, int c, int row_elems) {
  return r * row_elems + ((c ^ (r & 7)) << 3);
}

// Two floats as an mma fragment word of bf16 (lo in the lower half), and back.
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ float2 UnpackBf16(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
}

__device__ __forceinline__ void Ldmatrix4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

__device__ __forceinline__ void Ldmatrix4Trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

// The inverse of Ldmatrix4: lanes 8i..8i+7 address the rows of matrix i; r[i]
// is this thread's fragment of matrix i (row lane / 4, columns 2 (lane % 4)
// and + 1: an mma accumulator's pair packed by PackBf16).
__device__ __forceinline__ void Stmatrix4(void* p, const uint32_t (&r)[4]) {
  asm volatile(
      "stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(SmemAddr(p)),
      "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
      : "memory");
}

// c += a · b, m16n8k16, bf16 in, fp32 accumulate.
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a · b, m16n8k16, f16 in, fp32 accumulate.
__device__ __forceinline__ void MmaF16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                       uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// c += a · b, m16n8k32, e4m3 in (four codes a register, the lower k first),
// fp32 accumulate (sm_89 and later).
__device__ __forceinline__ void MmaE4m3(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_MMA_CUH_
