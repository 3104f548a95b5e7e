// What both MLA prefill kernels (mla_prefill.cu: mma.sync, mla_prefill_wgmma.cu:
// wgmma) do per thread between their products: the online softmax of one
// 64-key tile and the epilogue (O / l, the log2-sum-exp, the merge with an
// earlier key range). A thread holds two query rows, r_lo and r_hi = r_lo + 8,
// in the mma.m16n8 accumulator layout both products share: for n-tile j
// (8 columns), x[4j + 0..1] are row r_lo's columns 8j + 2tq + {0, 1} and
// x[4j + 2..3] row r_hi's; the quad (tq = 0..3) holds a row's whole tile.
#ifndef MOESH_KERNELS_CUDA_MLA_PREFILL_COMMON_CUH_
#define MOESH_KERNELS_CUDA_MLA_PREFILL_COMMON_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/params.h"

namespace moesh::cuda::mla_prefill {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr int kSRegs = kTileK / 2;     // a thread's scores of one tile (two rows)
inline constexpr int kORegs = kVDim / 2;      // a thread's output values (two rows)
inline constexpr int kPvSteps = kTileK / 16;  // k-steps of P · V

// A thread's running softmax state of its two rows (base 2; l: this
// thread's columns only until FinishRows sums the quad).
struct RowState {
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
};

// One tile's raw scores `sc` (keys j0 + 8j + 2tq + {0, 1}): scaled to base
// 2; if `masked`, keys at or past num_k or past a row's last visible key
// (see_lo / see_hi: key j is visible iff j <= see) set to -inf; the running
// max and sum updated, O rescaled, and P rounded to bf16 as the A fragments
// of P · V (k-step kk: n-tiles 2kk and 2kk + 1); l sums the rounded values.
__device__ __forceinline__ void SoftmaxTile(float (&sc)[kSRegs], float (&o)[kORegs],
                                            uint32_t (&pa)[kPvSteps][4], RowState& st, bool masked,
                                            int j0, int num_k, int see_lo, int see_hi, int tq,
                                            float scale_log2) {
#pragma unroll
  for (int i = 0; i < kSRegs; ++i) {
    float v = sc[i] * scale_log2;
    if (masked) {
      const int j = j0 + (i / 4) * 8 + 2 * tq + (i & 1);
      if (j >= num_k || j > ((i & 2) ? see_hi : see_lo)) v = -INFINITY;
    }
    sc[i] = v;
  }
  float mx_lo = st.m_lo, mx_hi = st.m_hi;
#pragma unroll
  for (int j = 0; j < kSRegs / 4; ++j) {
    mx_lo = fmaxf(mx_lo, fmaxf(sc[4 * j + 0], sc[4 * j + 1]));
    mx_hi = fmaxf(mx_hi, fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
  }
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {  // the quad holding the rows
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
  }
  // A row with no visible key yet keeps max -inf: subtract 0 instead (its
  // probabilities are exp2(-inf) = 0, and alpha multiplies zeros).
  const float base_lo = mx_lo == -INFINITY ? 0.0f : mx_lo;
  const float base_hi = mx_hi == -INFINITY ? 0.0f : mx_hi;
  const float alpha_lo = exp2f(st.m_lo - base_lo), alpha_hi = exp2f(st.m_hi - base_hi);
  st.m_lo = mx_lo, st.m_hi = mx_hi;
  float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
  for (int j = 0; j < kSRegs / 4; ++j) {
    const uint32_t lo = PackBf16(exp2f(sc[4 * j + 0] - base_lo), exp2f(sc[4 * j + 1] - base_lo));
    const uint32_t hi = PackBf16(exp2f(sc[4 * j + 2] - base_hi), exp2f(sc[4 * j + 3] - base_hi));
    const __nv_bfloat162 lo2 = *reinterpret_cast<const __nv_bfloat162*>(&lo);
    const __nv_bfloat162 hi2 = *reinterpret_cast<const __nv_bfloat162*>(&hi);
    sum_lo += __low2float(lo2) + __high2float(lo2);
    sum_hi += __low2float(hi2) + __high2float(hi2);
    pa[j / 2][(j & 1) * 2 + 0] = lo;
    pa[j / 2][(j & 1) * 2 + 1] = hi;
  }
  st.l_lo = st.l_lo * alpha_lo + sum_lo;
  st.l_hi = st.l_hi * alpha_hi + sum_hi;
#pragma unroll
  for (int j = 0; j < kORegs / 4; ++j) {
    o[4 * j + 0] *= alpha_lo, o[4 * j + 1] *= alpha_lo;
    o[4 * j + 2] *= alpha_hi, o[4 * j + 3] *= alpha_hi;
  }
}

// Row r's earlier log2-sum-exp (p.merge), read before any lane of the warp
// writes the row's new one.
__device__ __forceinline__ float PrevLse(const MlaPrefillParams& p, int h, int r) {
  return p.merge && r < p.num_q ? p.lse[static_cast<int64_t>(r) * p.num_heads + h] : -INFINITY;
}

// Row r (half 0: r_lo, 1: r_hi of `o`): O / l with log2-sum-exp `lse2`,
// merged with the earlier ranges' (log2-sum-exp `prev`) if p.merge.
__device__ __forceinline__ void StoreRow(const MlaPrefillParams& p, int h, int r, int tq,
                                         const float (&o)[kORegs], int half, float l, float lse2,
                                         float prev) {
  if (r >= p.num_q) return;
  bf16* out = p.out + r * p.out_ld + static_cast<int64_t>(h) * p.out_head_stride + 2 * tq;
  float w_new = l > 0.0f ? 1.0f / l : 0.0f, w_old = 0.0f, total = lse2;
  if (p.merge) {
    const float m = fmaxf(prev, lse2);
    if (m == -INFINITY) {
      w_new = 0.0f;
    } else {
      w_old = exp2f(prev - m);
      const float e_new = exp2f(lse2 - m);
      const float denom = w_old + e_new;
      w_old /= denom;
      w_new *= e_new / denom;
      total = m + log2f(denom);
    }
  }
#pragma unroll
  for (int j = 0; j < kORegs / 4; ++j) {
    float a = o[4 * j + 2 * half] * w_new, b = o[4 * j + 2 * half + 1] * w_new;
    if (p.merge) {
      const __nv_bfloat162 old = *reinterpret_cast<const __nv_bfloat162*>(out + 8 * j);
      a += w_old * __low2float(old);
      b += w_old * __high2float(old);
    }
    *reinterpret_cast<uint32_t*>(out + 8 * j) = PackBf16(a, b);
  }
  if (p.lse != nullptr && tq == 0) p.lse[static_cast<int64_t>(r) * p.num_heads + h] = total;
}

// The epilogue of a thread's two rows. Every lane of the warp calls it.
__device__ __forceinline__ void FinishRows(const MlaPrefillParams& p, int h, int r_lo, int tq,
                                           const float (&o)[kORegs], RowState st) {
#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    st.l_lo += __shfl_xor_sync(0xffffffffu, st.l_lo, off);
    st.l_hi += __shfl_xor_sync(0xffffffffu, st.l_hi, off);
  }
  const int r_hi = r_lo + 8;
  const float prev_lo = PrevLse(p, h, r_lo), prev_hi = PrevLse(p, h, r_hi);
  __syncwarp();  // the quads' reads of lse before any of its writes
  StoreRow(p, h, r_lo, tq, o, 0, st.l_lo, st.l_lo > 0.0f ? st.m_lo + log2f(st.l_lo) : -INFINITY,
           prev_lo);
  StoreRow(p, h, r_hi, tq, o, 1, st.l_hi, st.l_hi > 0.0f ? st.m_hi + log2f(st.l_hi) : -INFINITY,
           prev_hi);
}

// The order both prefill kernels take their (query tile, head) pairs in: a
// 1-D grid of num_qt * num_heads CTAs in groups of `group` heads (the last
// group may be smaller); within a group the query tiles run longest first
// (the last tile sees the most keys) across its heads. The CTAs resident at
// once are a few heads' tiles, which stream the same keys and values, so L2
// serves them once: with every head's first tile first, 128 heads' rows at
// 16K keys (1 GB) went through HBM once a query tile (BENCHMARKS, twentieth
// session). PrefillHeadsPerGroup picks `group`.
struct PrefillTile {
  int qt, h;
};
__device__ __forceinline__ PrefillTile PrefillTileOf(int cta, int num_qt, int num_heads,
                                                     int group) {
  const int g = cta / (group * num_qt), r = cta - g * group * num_qt;
  const int heads = min(group, num_heads - g * group);
  return {num_qt - 1 - r / heads, g * group + r % heads};
}

// As many heads as keep their keys and values (num_k x 512 bytes a head)
// within three quarters of the device's L2, at least 1 and at most
// num_heads.
absl::StatusOr<int> PrefillHeadsPerGroup(const MlaPrefillParams& p);

// The wgmma kernel (mla_prefill_wgmma.cu) for RunMlaPrefill, after its
// checks: its own (16-byte aligned q_nope and q_pe, strides of whole 16
// bytes: tensor copies), then the launch.
absl::Status LaunchMlaPrefillWgmma(const MlaPrefillParams& p);

}  // namespace moesh::cuda::mla_prefill

#endif  // MOESH_KERNELS_CUDA_MLA_PREFILL_COMMON_CUH_
