// What the grouped GEMMs share: the output stores (grouped_gemm.cu,
// grouped_gemm_fp8.cu, grouped_gemm_fp8_wgmma.cu), and the tile lookup of the
// first two (the persistent wgmma kernel walks its own 128-row items): the
// grid is a host bound on the tiles, the real tile count and each expert's
// first tile live on the device (MoePermuteParams' tile_offsets), so a
// launch needs no host sync and is graph-capturable.
#ifndef MOESH_KERNELS_CUDA_GROUPED_TILES_CUH_
#define MOESH_KERNELS_CUDA_GROUPED_TILES_CUH_

#include <cuda_bf16.h>

#include <cstdint>

namespace moesh::cuda {

// Two adjacent outputs (v0, v1) at element `off` of y: fp32 or rounded to a
// bf16 pair (off even).
template <bool kF32Out>
__device__ __forceinline__ void StorePair(void* y, int64_t off, float v0, float v1) {
  if constexpr (kF32Out) {
    *reinterpret_cast<float2*>(static_cast<float*>(y) + off) = make_float2(v0, v1);
  } else {
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(y) + off) =
        __floats2bfloat162_rn(v0, v1);
  }
}

// A warp's mma.m16n8 accumulators to an expert's output rows: acc[mi][ni]
// holds tile rows r0 + mi * 16 + lane / 4 (+ 8 for [2], [3]) by columns c0 +
// ni * 8 + (lane % 4) * 2 (+ 1); tile row r is y's row row0 + r, stored when
// r < rows and the column < n.
template <bool kF32Out, int kMi, int kNi>
__device__ __forceinline__ void StoreWarpTile(const float (&acc)[kMi][kNi][4], void* y, int64_t ldy,
                                              int n, int row0, int rows, int r0, int c0, int lane) {
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
    for (int ni = 0; ni < kNi; ++ni) {
      const int col = c0 + ni * 8 + t4 * 2;
      if (col >= n) continue;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = r0 + mi * 16 + g + half * 8;
        if (r >= rows) continue;
        const int64_t off = static_cast<int64_t>(row0 + r) * ldy + col;
        StorePair<kF32Out>(y, off, acc[mi][ni][2 * half], acc[mi][ni][2 * half + 1]);
      }
    }
  }
}

// The expert tile `tile` belongs to: the last e whose first tile is <= tile
// (binary search over tile_offsets[0..num_experts)). REQUIRES tile <
// tile_offsets[num_experts].
__device__ __forceinline__ int ExpertOfTile(const int32_t* tile_offsets, int num_experts,
                                            int tile) {
  int lo = 0, hi = num_experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (tile_offsets[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_GROUPED_TILES_CUH_
