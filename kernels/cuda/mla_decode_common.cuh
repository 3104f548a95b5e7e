// What the MLA decode kernels share (internal to mla_decode*.cu): the split of
// a sequence's tiles, bf16 packing, and the launchers of the 64-heads-per-CTA
// kernel and of the FP8-row kernel that RunMlaDecode dispatches to.
#ifndef MOESH_KERNELS_CUDA_MLA_DECODE_COMMON_CUH_
#define MOESH_KERNELS_CUDA_MLA_DECODE_COMMON_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/config.h"
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

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float2 UnpackBf16(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v));
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

// The 64-heads-per-CTA kernel (mla_decode_wide.cu) over grid (num_splits,
// ceil(num_heads / 64), batch); RunMlaDecode has checked `p` and launches
// the combine after it when num_splits > 1.
absl::Status LaunchMlaDecodeWide(const MlaDecodeParams& p);

// The FP8-row kernel (mla_decode_fp8.cu, KvCacheDtype::kFp8), 16 heads a CTA,
// over grid (num_splits, ceil(num_heads / 16), batch) in the 16-head tile
// shape `t` names (RunMlaDecode resolves kDefault and the 64-head shape to
// mla::kFp8DefaultTile first); it has checked `p` and launches the combine
// after it.
struct Fp8TileShape {
  int tile_tokens, ctas_per_sm;
};
Fp8TileShape MlaFp8TileShape(MlaTileConfig t);
absl::Status LaunchMlaDecodeFp8(const MlaDecodeParams& p, MlaTileConfig t);

}  // namespace moesh::cuda::mla

#endif  // MOESH_KERNELS_CUDA_MLA_DECODE_COMMON_CUH_
