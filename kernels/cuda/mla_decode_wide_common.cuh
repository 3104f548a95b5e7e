// The parts of the 64-heads-per-CTA MLA decode kernel (mla_decode_wide.cu)
// that do not depend on the rows' kind (bf16 or FP8): Q into shared memory, warpgroup 0's online
// softmax of a 64-token tile and its hand-off of P, and the epilogue. Layouts are wgmma.cuh's SW128
// column blocks; a consumer thread holds rows row_lo = 16 (warp % 4) + lane / 4 and row_hi = row_lo
// + 8 of the 64 heads (wgmma's accumulator layout).
#ifndef MOESH_KERNELS_CUDA_MLA_DECODE_WIDE_COMMON_CUH_
#define MOESH_KERNELS_CUDA_MLA_DECODE_WIDE_COMMON_CUH_

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/config.h"
#include "kernels/cuda/mla_decode_common.cuh"
#include "kernels/cuda/params.h"
#include "kernels/cuda/wgmma.cuh"

namespace moesh::cuda::mla::wide {

inline constexpr int kTile = kKvBlockSize;       // tokens per tile: one cache block
inline constexpr int kBlockBytes = kTile * 128;  // one SW128 column block of 64 rows: 8 KB
inline constexpr int kQBlocks = kHeadDim / 64;   // 9 column blocks of Q (and of a bf16 row)
inline constexpr int kOutDims = kLatentDim / 2;  // latent dims a consumer warpgroup owns
inline constexpr int kSRegs = kTile / 2;         // m64n64 score accumulators per thread
inline constexpr int kORegs = kOutDims / 2;      // m64n256 output accumulators per thread
static_assert(kWideHeads == 64 && kHeadDim % 64 == 0);

// The CTA's work: grid (num_splits, ceil(num_heads / 64), batch); tiles
// [begin, begin + n) of sequence b, heads [head0, head0 + 64). The tiles
// depend on blockIdx.x and z alone: mla_decode_wide.cu's CTA pairs (the
// same x and z) rely on both having the same n.
struct Cta {
  int split, head0, b, seq_len, begin, n;
};
__device__ __forceinline__ Cta CtaOf(const MlaDecodeParams& p) {
  Cta c;
  c.split = blockIdx.x, c.head0 = blockIdx.y * kWideHeads, c.b = blockIdx.z;
  c.seq_len = p.seq_lens[c.b];
  const SplitRange range = SplitTiles((c.seq_len + kTile - 1) / kTile, c.split, p.num_splits);
  c.begin = range.begin, c.n = range.end - range.begin;
  return c;
}

// The dynamic shared memory as T, aligned to 1024 bytes (SW128; the launch
// asks for sizeof(T) + 1024).
template <typename T>
__device__ __forceinline__ T& AlignedSmem(uint8_t* raw) {
  return *reinterpret_cast<T*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t{1023});
}

// Q [64 heads, 576] of sequence b from head0 (zeros past num_heads) into
// kQBlocks SW128 column blocks at q; threads [0, threads) of the CTA share it.
__device__ __forceinline__ void LoadQ(uint8_t* q, const MlaDecodeParams& p, int b, int head0,
                                      int tid, int threads) {
  for (int i = tid; i < kWideHeads * kQBlocks * 8; i += threads) {
    const int row = i / (kQBlocks * 8), chunk = i % (kQBlocks * 8), h = head0 + row;
    const uint4 v = h < p.num_heads
                        ? reinterpret_cast<const uint4*>(
                              p.q + (static_cast<int64_t>(b) * p.num_heads + h) * kHeadDim)[chunk]
                        : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(q + (chunk / 8) * kBlockBytes +
                              wgmma::Swizzle128Offset(row, (chunk % 8) * 8)) = v;
  }
}

// The rescale of O a tile's P goes with, rows lo and hi.
struct Rescale {
  float lo, hi;
};

// Warpgroup 0's online softmax of tile `tile`'s scores sc (S = Q · K^T):
// scaled to log2 units, tokens at or past seq_len -inf, the running maxima m
// raised (every tile holds a token of the sequence: they stay finite), P as
// bf16 A fragments in pa (k step kk covers n-tiles 2kk and 2kk + 1), l the
// running sums of what P · V will use (the rounded probabilities; this
// thread's columns, the quad sums at the end), o rescaled. Returns the
// rescale for warpgroup 1.
__device__ __forceinline__ Rescale SoftmaxTile(float (&sc)[kSRegs], int tile, int seq_len,
                                               float scale_log2, int tq, float& m_lo, float& m_hi,
                                               float& l_lo, float& l_hi, float (&o)[kORegs],
                                               uint32_t (&pa)[kTile / 16][4]) {
  float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
  for (int j = 0; j < kSRegs / 4; ++j) {
    const int tok = tile * kTile + j * 8 + 2 * tq;
    const bool ok0 = tok < seq_len, ok1 = tok + 1 < seq_len;
    sc[4 * j + 0] = ok0 ? sc[4 * j + 0] * scale_log2 : -INFINITY;
    sc[4 * j + 1] = ok1 ? sc[4 * j + 1] * scale_log2 : -INFINITY;
    sc[4 * j + 2] = ok0 ? sc[4 * j + 2] * scale_log2 : -INFINITY;
    sc[4 * j + 3] = ok1 ? sc[4 * j + 3] * scale_log2 : -INFINITY;
    mx_lo = fmaxf(mx_lo, fmaxf(sc[4 * j + 0], sc[4 * j + 1]));
    mx_hi = fmaxf(mx_hi, fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
  }
  const Rescale alpha{exp2f(m_lo - mx_lo), exp2f(m_hi - mx_hi)};
  m_lo = mx_lo;
  m_hi = mx_hi;
  float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
  for (int j = 0; j < kSRegs / 4; ++j) {
    const uint32_t plo = PackBf16(exp2f(sc[4 * j + 0] - m_lo), exp2f(sc[4 * j + 1] - m_lo));
    const uint32_t phi = PackBf16(exp2f(sc[4 * j + 2] - m_hi), exp2f(sc[4 * j + 3] - m_hi));
    pa[j / 2][(j % 2) * 2 + 0] = plo;
    pa[j / 2][(j % 2) * 2 + 1] = phi;
    const float2 x = UnpackBf16(plo), y = UnpackBf16(phi);
    sum_lo += x.x + x.y;
    sum_hi += y.x + y.y;
  }
  l_lo = l_lo * alpha.lo + sum_lo;
  l_hi = l_hi * alpha.hi + sum_hi;
#pragma unroll
  for (int j = 0; j < kORegs / 4; ++j) {
    o[4 * j + 0] *= alpha.lo, o[4 * j + 1] *= alpha.lo;
    o[4 * j + 2] *= alpha.hi, o[4 * j + 3] *= alpha.hi;
  }
  return alpha;
}

// P (pa, rows lo and hi of this thread) into the SW128 block at dst, the
// rescale into alpha[64] (the quad's first lane), then the proxy fence that
// lets warpgroup 1's wgmma read them.
__device__ __forceinline__ void StoreP(uint8_t* dst, float* alpha,
                                       const uint32_t (&pa)[kTile / 16][4], int row_lo, int row_hi,
                                       int tq, Rescale a) {
#pragma unroll
  for (int j = 0; j < kSRegs / 4; ++j) {
    const int col = j * 8 + 2 * tq;
    *reinterpret_cast<uint32_t*>(dst + wgmma::Swizzle128Offset(row_lo, col)) =
        pa[j / 2][(j % 2) * 2 + 0];
    *reinterpret_cast<uint32_t*>(dst + wgmma::Swizzle128Offset(row_hi, col)) =
        pa[j / 2][(j % 2) * 2 + 1];
  }
  if (tq == 0) alpha[row_lo] = a.lo, alpha[row_hi] = a.hi;
  wgmma::FenceProxyAsync();
}

// Warpgroup 1's side of the rescale: O rows lo and hi times alpha.
__device__ __forceinline__ void RescaleO(float (&o)[kORegs], Rescale a) {
#pragma unroll
  for (int j = 0; j < kORegs / 4; ++j) {
    o[4 * j + 0] *= a.lo, o[4 * j + 1] *= a.lo;
    o[4 * j + 2] *= a.hi, o[4 * j + 3] *= a.hi;
  }
}

// Warpgroup 0 after its last tile: the quads' sums of l, and m and l of its
// rows into m[64] and l[64] for both warpgroups' epilogues.
__device__ __forceinline__ void StoreStats(float* m, float* l, int row_lo, int row_hi, int tq,
                                           float m_lo, float m_hi, float l_lo, float l_hi) {
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  if (tq == 0) {
    m[row_lo] = m_lo, m[row_hi] = m_hi;
    l[row_lo] = l_lo, l[row_hi] = l_hi;
  }
}

// The epilogue of consumer warpgroup wg: rows lo/hi of its 256 dims,
// normalized by l (m and l of the 64 heads in log2 units; n the split's
// tiles), as split partials (kSplit) or the final rows.
template <bool kSplit, typename OutT>
__device__ __forceinline__ void WriteOut(const MlaDecodeParams& p, const float (&o)[kORegs], int b,
                                         int split, int head0, int wg, int row_lo, int tq,
                                         const float* m, const float* l, int n) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_lo + half * 8, h = head0 + row;
    if (h >= p.num_heads) continue;
    const float lr = l[row], mr = m[row];
    const float inv = lr > 0.0f ? 1.0f / lr : 0.0f;
    const float lse2 = n > 0 ? mr + log2f(lr) : -INFINITY;
    const int dim0 = wg * kOutDims + 2 * tq;
    if constexpr (kSplit) {
      float* part = SplitPartial(p, b, split, h) + dim0;
#pragma unroll
      for (int j = 0; j < kORegs / 4; ++j) {
        *reinterpret_cast<float2*>(part + j * 8) =
            make_float2(o[4 * j + 2 * half] * inv, o[4 * j + 2 * half + 1] * inv);
      }
      if (wg == 0 && tq == 0) *SplitLse(p, b, split, h) = lse2;
    } else {
      const int64_t bh = static_cast<int64_t>(b) * p.num_heads + h;
      OutT* out = static_cast<OutT*>(p.out) + bh * kLatentDim + dim0;
#pragma unroll
      for (int j = 0; j < kORegs / 4; ++j) {
        const float x = o[4 * j + 2 * half] * inv, y = o[4 * j + 2 * half + 1] * inv;
        if constexpr (std::is_same_v<OutT, float>) {
          *reinterpret_cast<float2*>(out + j * 8) = make_float2(x, y);
        } else {
          *reinterpret_cast<__nv_bfloat162*>(out + j * 8) = __floats2bfloat162_rn(x, y);
        }
      }
      if (p.lse != nullptr && wg == 0 && tq == 0) p.lse[bh] = lse2 * 0.6931471805599453f;
    }
  }
}

}  // namespace moesh::cuda::mla::wide

#endif  // MOESH_KERNELS_CUDA_MLA_DECODE_WIDE_COMMON_CUH_
