// What the MLA decode kernels share (internal to mla_decode*.cu): the split of
// a sequence's tiles, bf16 packing, and the launchers of the 64-heads-per-CTA
// kernel and of the FP8-row kernel that RunMlaDecode dispatches to.
#ifndef MOESH_KERNELS_CUDA_MLA_DECODE_COMMON_CUH_
#define MOESH_KERNELS_CUDA_MLA_DECODE_COMMON_CUH_

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/params.h"

namespace moesh::cuda::mla {

inline constexpr float kLog2e = 1.4426950408889634f;

struct SplitRange {
  int begin, end;  // tiles [begin, end) of the sequence
};

__device__ __forceinline__ SplitRange SplitTiles(int n_tiles, int split, int num_splits) {
  return {static_cast<int>(static_cast<int64_t>(split) * n_tiles / num_splits),
          static_cast<int>(static_cast<int64_t>(split + 1) * n_tiles / num_splits)};
}

// The 16-head kernels' scores of the tokens warp w finishes, [w, w + 1) ·
// kTile / 4 of the tile: the four warps' partials (spart[warp][head][token])
// summed, in log2 units, tokens at or past seq_len -inf (st: rows g, g + 8 as
// an mma C fragment); then the running maxima of rows g and g + 8 raised to
// the tile's (m_lo / m_hi in: the old, out: the new; rmax carries the warps'
// maxima: all threads, ends after a __syncthreads).
template <int kTile, int kPitch>
__device__ __forceinline__ void FinishTileScores(
    const float (&spart)[kWarps][kHeadsPerBlock][kPitch], float (&rmax)[kWarps][kHeadsPerBlock],
    int tile, int seq_len, float scale_log2, float (&st)[kTile / 32][4], float& m_lo, float& m_hi) {
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2, tq = threadIdx.x & 3;
  float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
  for (int jj = 0; jj < kTile / 32; ++jj) {
    const int col = warp * (kTile / 4) + jj * 8 + 2 * tq;
    float2 lo = make_float2(0.0f, 0.0f), hi = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int v = 0; v < kWarps; ++v) {
      const float2 a = *reinterpret_cast<const float2*>(&spart[v][g][col]);
      const float2 c = *reinterpret_cast<const float2*>(&spart[v][g + 8][col]);
      lo.x += a.x, lo.y += a.y, hi.x += c.x, hi.y += c.y;
    }
    const int tok = tile * kTile + col;
    const bool ok0 = tok < seq_len, ok1 = tok + 1 < seq_len;
    st[jj][0] = ok0 ? lo.x * scale_log2 : -INFINITY;
    st[jj][1] = ok1 ? lo.y * scale_log2 : -INFINITY;
    st[jj][2] = ok0 ? hi.x * scale_log2 : -INFINITY;
    st[jj][3] = ok1 ? hi.y * scale_log2 : -INFINITY;
    mx_lo = fmaxf(mx_lo, fmaxf(st[jj][0], st[jj][1]));
    mx_hi = fmaxf(mx_hi, fmaxf(st[jj][2], st[jj][3]));
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
  }
  if (tq == 0) {
    rmax[warp][g] = mx_lo;
    rmax[warp][g + 8] = mx_hi;
  }
  __syncthreads();
#pragma unroll
  for (int v = 0; v < kWarps; ++v) {
    m_lo = fmaxf(m_lo, rmax[v][g]);
    m_hi = fmaxf(m_hi, rmax[v][g + 8]);
  }
}

// The partials of split `split` (kSplit) or the final rows: both kernels
// write out / lse / workspace in the layouts MlaDecodeParams and the combine
// kernel read. Workspace: [batch, num_splits, num_heads, 512] fp32 partials
// (O / l), then [batch, num_splits, num_heads] log2-sum-exps.
__device__ __forceinline__ float* SplitPartial(const MlaDecodeParams& p, int b, int split, int h) {
  return static_cast<float*>(p.workspace) +
         ((static_cast<int64_t>(b) * p.num_splits + split) * p.num_heads + h) * kLatentDim;
}
__device__ __forceinline__ float* SplitLse(const MlaDecodeParams& p, int b, int split, int h) {
  return static_cast<float*>(p.workspace) +
         static_cast<int64_t>(p.batch) * p.num_splits * p.num_heads * kLatentDim +
         (static_cast<int64_t>(b) * p.num_splits + split) * p.num_heads + h;
}

// The 64-heads-per-CTA kernel (mla_decode_wide.cu,
// MlaTileConfig::kHeads64Tokens64Stages2) over grid (num_splits,
// ceil(num_heads / 64), batch), over bf16 or FP8 rows (p.kv_dtype);
// RunMlaDecode has checked `p` and launches the combine after it when
// num_splits > 1.
absl::Status LaunchMlaDecodeWide(const MlaDecodeParams& p);

// The FP8-row kernel (mla_decode_fp8.cu, KvCacheDtype::kFp8), 16 heads a CTA,
// over grid (num_splits, ceil(num_heads / 16), batch) in the 16-head tile
// shape `t` names (RunMlaDecode resolves kDefault below 64 heads to
// mla::kFp8DefaultTile first); it has checked `p` and launches the combine
// after it.
struct Fp8TileShape {
  int tile_tokens, ctas_per_sm;
};
Fp8TileShape MlaFp8TileShape(MlaTileConfig t);
absl::Status LaunchMlaDecodeFp8(const MlaDecodeParams& p, MlaTileConfig t);

}  // namespace moesh::cuda::mla

#endif  // MOESH_KERNELS_CUDA_MLA_DECODE_COMMON_CUH_
