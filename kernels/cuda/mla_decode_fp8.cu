// MLA decode over an FP8 latent cache (KvCacheDtype::kFp8: 656-byte rows of
// cpu::Fp8KvRowLayout, [512 e4m3 codes | 4 float32 power-of-two scales, one
// per 128 codes | 64 bf16 rope]). One CTA = (KV split, group of 16 heads,
// sequence), four warps; the codes go from the shared-memory ring straight
// into the mma fragments (no bf16 copy of the tile):
//   * warp 0 streams tiles into a kStages ring, one cp.async.bulk a tile (the
//     rows are contiguous in the pool and in the ring; 656 bytes = 164 words
//     put eight consecutive rows 4 banks apart, so ldmatrix is conflict-free);
//   * S = Q·K^T: warp w owns latent group w (dims [128w, 128w + 128): one
//     scale a token) and rope dims [16w, 16w + 16). ldmatrix of the codes as
//     b16 pairs hands a thread 4 consecutive dims of a token, which become
//     the two f16x2 halves of a B fragment with one cvt each (the k order
//     within an mma is permuted: Q's fragment is loaded in the same order).
//     Q's latent is f16, each head prescaled by 2^-sigma so its largest
//     value is below 2^15 (exact: bf16 values times a power of two); the
//     group's fp32 scores are then multiplied by 2^sigma and the token's
//     scale, and the rope part (bf16) accumulates on top;
//   * online softmax in fp32 (base 2) as the bf16 kernel; P rounded to bf16
//     (l sums those), then written once per latent group g as
//     f16(P * scale[t][g] * 2^15 / smax_g), smax_g the tile's largest scale
//     of the group: at most 2^15, and exact down to P * scale / smax of
//     2^-29 (powers of two; f16 is normal from 2^-14);
//   * O += P'·V: warp w owns group w's 128 output dims. ldmatrix.trans of the
//     codes as b16 pairs hands a thread two tokens of two adjacent dims; one
//     prmt splits them into the even dim's and the odd dim's B fragments
//     (two n-tiles: the even and the odd dims of 16). O is kept in units of
//     the last tile's smax / 2^15 (the rescale rides on the softmax's alpha).
// Splits write (O / l, log2-sum-exp) partials for MlaCombineKernel
// (mla_decode.cu), in the bf16 kernel's layouts.
#include <cuda_fp16.h>

#include <climits>
#include <cmath>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8_kv.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mla_decode_common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pdl.cuh"

namespace moesh::cuda::mla {
namespace {

constexpr cpu::Fp8KvRowLayout kRow{kLatentDim, kRopeDim};
constexpr int kRowBytes = kRow.bytes();  // 656
constexpr int kScales = kRow.scales_offset();
constexpr int kRope = kRow.rope_offset();
constexpr int kGroup = cpu::kFp8Block;         // 128 codes a scale
constexpr int kGroupSteps = kGroup / 16;       // 8 mma k-steps of a group
constexpr int kRopeSlice = kRopeDim / kWarps;  // 16 rope dims a warp: one k-step
constexpr int kVChunks = kGroup / 16;          // 16-dim chunks of a warp's output
constexpr float kPScale = 32768.0f;            // P' = P · scale / smax · 2^15 <= 2^15 in f16
static_assert(kLatentDim == kWarps * kGroup && kRopeSlice == 16);
static_assert(kRowBytes % 16 == 0 && kScales % 16 == 0 && kRope % 16 == 0);
static_assert((kRowBytes / 4) % 32 == 4, "eight rows an ldmatrix reads fill the 32 banks");

template <int kTile, int kStages>
struct Fp8Cfg {
  static constexpr int kTileTokens = kTile;
  static constexpr int kNumStages = kStages;
  static constexpr int kTilesPerBlock = kKvBlockSize / kTile;
  static constexpr int kSTiles = kTile / 8;     // mma n-tiles of scores
  static constexpr int kOwnTiles = kTile / 32;  // n-tiles each warp finishes
  static constexpr int kPitch = kTile + 8;      // conflict-free score/prob rows
  static_assert(kTile % 32 == 0 && kKvBlockSize % kTile == 0);

  struct Smem {
    uint8_t rows[kStages][kTile][kRowBytes];
    float spart[kWarps][kHeadsPerBlock][kPitch];
    __half probs[kWarps][kHeadsPerBlock][kPitch];  // per latent group
    float rmax[kWarps][kHeadsPerBlock];
    float rsum[kWarps][kHeadsPerBlock];
    float smax[kWarps];                  // the tile's largest scale per group
    float qmax[kWarps][kHeadsPerBlock];  // |q| per head over a warp's group
    alignas(8) uint64_t bar[kStages];
  };
  static_assert(sizeof(Smem) <= 227 * 1024, "over Hopper's shared memory per CTA");
  static constexpr int kCtasPerSm = 233472 / (sizeof(Smem) + 1024);
};

// Warp 0: starts the copy of the sequence's tile `tile` into `stage`. Rows past
// the sequence's end are zeroed instead: zero codes and zero scales (their
// probabilities are 0, and 0 · NaN of stale shared memory would poison O).
template <typename C>
__device__ __forceinline__ void IssueTile(typename C::Smem& s, const MlaDecodeParams& p, int b,
                                          int tile, int stage, int seq_len, int lane) {
  constexpr int kTile = C::kTileTokens;
  const int block =
      p.block_table[static_cast<int64_t>(b) * p.max_blocks_per_seq + tile / C::kTilesPerBlock];
  const int valid = min(kTile, seq_len - tile * kTile);
  const uint8_t* src =
      reinterpret_cast<const uint8_t*>(p.kv_cache) +
      (static_cast<int64_t>(block) * kKvBlockSize + (tile % C::kTilesPerBlock) * kTile) * kRowBytes;
  for (int i = valid * (kRowBytes / 16) + lane; i < kTile * (kRowBytes / 16); i += 32)
    reinterpret_cast<uint4*>(&s.rows[stage][0][0])[i] = make_uint4(0, 0, 0, 0);
  __syncwarp();
  if (lane == 0) {
    MbarArriveExpectTx(&s.bar[stage], valid * kRowBytes);
    if (valid > 0) BulkCopyG2S(&s.rows[stage][0][0], src, valid * kRowBytes, &s.bar[stage]);
  }
}

__device__ __forceinline__ float Pow2(int e) { return __int_as_float((127 + e) << 23); }

__device__ __forceinline__ uint32_t PackF16(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// sigma with max|q| · 2^-sigma in [2^14, 2^15) (0 for an all-zero head),
// kept where 2^±sigma are normal floats.
__device__ __forceinline__ int QShift(float amax) {
  if (!(amax > 0.0f) || !isfinite(amax)) return 0;
  int e = 0;
  frexpf(amax, &e);  // amax < 2^e
  return max(-100, min(113, e - 15));
}

template <typename C, bool kSplit, typename OutT>
__global__ void __launch_bounds__(kThreads, C::kCtasPerSm) MlaDecodeFp8Kernel(MlaDecodeParams p) {
  PdlBegin();
  constexpr int kTileTokens = C::kTileTokens, kStages = C::kNumStages, kSTiles = C::kSTiles;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  typename C::Smem& s = *reinterpret_cast<typename C::Smem*>(smem_raw);
  const int split = blockIdx.x, head0 = blockIdx.y * kHeadsPerBlock, b = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;  // mma fragment row group / thread in group
  const int seq_len = p.seq_lens[b];
  const int n_tiles = (seq_len + kTileTokens - 1) / kTileTokens;
  const SplitRange range = SplitTiles(n_tiles, split, p.num_splits);
  const int n = range.end - range.begin;

  if (threadIdx.x == 0) {
    for (int st = 0; st < kStages; ++st) MbarInit(&s.bar[st], 1);
    FenceMbarInit();
  }
  __syncthreads();
  if (warp == 0) {
    for (int i = 0; i < min(n, kStages); ++i)
      IssueTile<C>(s, p, b, range.begin + i, i, seq_len, lane);
  }

  // Q: this warp's group as f16 A fragments in the codes' k order (slot
  // 2tq + j is dim 4tq + j, slot 2tq + 8 + j is dim 4tq + 2 + j of a 16-dim
  // step), and its 16 rope dims as bf16 in the plain order.
  const int h_lo = head0 + g, h_hi = head0 + g + 8;
  const bool ok_lo = h_lo < p.num_heads, ok_hi = h_hi < p.num_heads;
  const bf16* q_lo = p.q + (static_cast<int64_t>(b) * p.num_heads + h_lo) * kHeadDim;
  const bf16* q_hi = q_lo + 8 * kHeadDim;
  uint2 qraw[kGroupSteps][2];
  float amax_lo = 0.0f, amax_hi = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kGroupSteps; ++kk) {
    const int d = warp * kGroup + kk * 16 + 4 * tq;
    qraw[kk][0] = ok_lo ? *reinterpret_cast<const uint2*>(q_lo + d) : make_uint2(0, 0);
    qraw[kk][1] = ok_hi ? *reinterpret_cast<const uint2*>(q_hi + d) : make_uint2(0, 0);
    const float2 a = UnpackBf16(qraw[kk][0].x), c = UnpackBf16(qraw[kk][0].y);
    const float2 e = UnpackBf16(qraw[kk][1].x), f = UnpackBf16(qraw[kk][1].y);
    amax_lo = fmaxf(amax_lo, fmaxf(fmaxf(fabsf(a.x), fabsf(a.y)), fmaxf(fabsf(c.x), fabsf(c.y))));
    amax_hi = fmaxf(amax_hi, fmaxf(fmaxf(fabsf(e.x), fabsf(e.y)), fmaxf(fabsf(f.x), fabsf(f.y))));
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    amax_lo = fmaxf(amax_lo, __shfl_xor_sync(0xffffffffu, amax_lo, off));
    amax_hi = fmaxf(amax_hi, __shfl_xor_sync(0xffffffffu, amax_hi, off));
  }
  if (tq == 0) {
    s.qmax[warp][g] = amax_lo;
    s.qmax[warp][g + 8] = amax_hi;
  }
  uint32_t qr[4];
  {
    const int d = kLatentDim + warp * kRopeSlice + 2 * tq;
    qr[0] = ok_lo ? *reinterpret_cast<const uint32_t*>(q_lo + d) : 0u;
    qr[1] = ok_hi ? *reinterpret_cast<const uint32_t*>(q_hi + d) : 0u;
    qr[2] = ok_lo ? *reinterpret_cast<const uint32_t*>(q_lo + d + 8) : 0u;
    qr[3] = ok_hi ? *reinterpret_cast<const uint32_t*>(q_hi + d + 8) : 0u;
  }
  __syncthreads();  // qmax, and the zero-filled rows of the first tiles, are visible
  int sig_lo, sig_hi;
  {
    float m_lo = 0.0f, m_hi = 0.0f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) {
      m_lo = fmaxf(m_lo, s.qmax[v][g]);
      m_hi = fmaxf(m_hi, s.qmax[v][g + 8]);
    }
    sig_lo = QShift(m_lo);
    sig_hi = QShift(m_hi);
  }
  uint32_t qf[kGroupSteps][4];
  {
    const float in_lo = Pow2(-sig_lo), in_hi = Pow2(-sig_hi);
#pragma unroll
    for (int kk = 0; kk < kGroupSteps; ++kk) {
      const float2 a = UnpackBf16(qraw[kk][0].x), c = UnpackBf16(qraw[kk][0].y);
      const float2 e = UnpackBf16(qraw[kk][1].x), f = UnpackBf16(qraw[kk][1].y);
      qf[kk][0] = PackF16(a.x * in_lo, a.y * in_lo);
      qf[kk][1] = PackF16(e.x * in_hi, e.y * in_hi);
      qf[kk][2] = PackF16(c.x * in_lo, c.y * in_lo);
      qf[kk][3] = PackF16(f.x * in_hi, f.y * in_hi);
    }
  }
  const float qs_lo = Pow2(sig_lo), qs_hi = Pow2(sig_hi);
  const float scale_log2 = p.softmax_scale * kLog2e;

  float o[2 * kVChunks][4];  // o[2c]: dims 16c + even, o[2c + 1]: 16c + odd
#pragma unroll
  for (int j = 0; j < 2 * kVChunks; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;  // rows g, g + 8
  float o_unit = 1.0f;  // O = o · o_unit (this group's smax of the last tile / 2^15)

  // ldmatrix lane roles: row within an 8x8 matrix, and which of the four.
  const int lm_r = lane & 7, lm_m = lane >> 3;

  for (int i = 0; i < n; ++i) {
    const int stage = i % kStages;
    const int tile = range.begin + i;
    MbarWait(&s.bar[stage], (i / kStages) & 1);
    const uint8_t(*rows)[kRowBytes] = s.rows[stage];  // [kTileTokens][kRowBytes]

    // This warp's partial scores: group `warp` in f16 codes, then its rope dims.
    float sc[kSTiles][4];
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kGroupSteps; ++kk) {
#pragma unroll
      for (int jb = 0; jb < kSTiles; jb += 4) {
        uint32_t r[4];  // r[m]: tokens 8 (jb + m) + g, dims 4tq.. 4tq + 3 of this step
        Ldmatrix4(r, &rows[jb * 8 + lane][warp * kGroup + kk * 16]);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          MmaF16(sc[jb + m], qf[kk], fp8kv::CodesToF16x2(r[m]), fp8kv::CodesToF16x2(r[m] >> 16));
        }
      }
    }
    float smax = 0.0f;
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) {
      const float s0 = reinterpret_cast<const float*>(rows[j * 8 + 2 * tq] + kScales)[warp];
      const float s1 = reinterpret_cast<const float*>(rows[j * 8 + 2 * tq + 1] + kScales)[warp];
      sc[j][0] *= qs_lo * s0, sc[j][1] *= qs_lo * s1;
      sc[j][2] *= qs_hi * s0, sc[j][3] *= qs_hi * s1;
      smax = fmaxf(smax, fmaxf(s0, s1));
    }
#pragma unroll
    for (int j = 0; j < kSTiles; j += 2) {
      uint32_t bfrag[4];
      Ldmatrix4(
          bfrag,
          &rows[j * 8 + (lm_m >> 1) * 8 + lm_r][kRope + 2 * (warp * kRopeSlice + (lm_m & 1) * 8)]);
      Mma(sc[j], qr, bfrag[0], bfrag[1]);
      Mma(sc[j + 1], qr, bfrag[2], bfrag[3]);
    }
    smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, 1));
    smax = fmaxf(smax, __shfl_xor_sync(0xffffffffu, smax, 2));
    if (lane == 0) s.smax[warp] = smax > 0.0f ? smax : 1.0f;
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) {
      *reinterpret_cast<float2*>(&s.spart[warp][g][j * 8 + 2 * tq]) =
          make_float2(sc[j][0], sc[j][1]);
      *reinterpret_cast<float2*>(&s.spart[warp][g + 8][j * 8 + 2 * tq]) =
          make_float2(sc[j][2], sc[j][3]);
    }
    __syncthreads();

    // Warp w finishes tokens [w, w + 1) · kTileTokens / 4: sum the partials, scale, mask.
    float st[C::kOwnTiles][4];
    float new_lo = m_lo, new_hi = m_hi;
    FinishTileScores<kTileTokens, C::kPitch>(s.spart, s.rmax, tile, seq_len, scale_log2, st, new_lo,
                                             new_hi);
    float inv_smax[kWarps];
#pragma unroll
    for (int v = 0; v < kWarps; ++v) inv_smax[v] = kPScale / s.smax[v];  // powers of two: exact
    float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
    for (int jj = 0; jj < C::kOwnTiles; ++jj) {
      const int col = warp * (kTileTokens / 4) + jj * 8 + 2 * tq;
      // P rounded to bf16 (what l sums), then per group times scale · 2^15 / smax in f16.
      const float2 a = UnpackBf16(PackBf16(exp2f(st[jj][0] - new_lo), exp2f(st[jj][1] - new_lo)));
      const float2 c = UnpackBf16(PackBf16(exp2f(st[jj][2] - new_hi), exp2f(st[jj][3] - new_hi)));
      const float4 s0 = *reinterpret_cast<const float4*>(rows[col] + kScales);
      const float4 s1 = *reinterpret_cast<const float4*>(rows[col + 1] + kScales);
      const float r0[kWarps] = {s0.x, s0.y, s0.z, s0.w}, r1[kWarps] = {s1.x, s1.y, s1.z, s1.w};
#pragma unroll
      for (int v = 0; v < kWarps; ++v) {
        const float f0 = r0[v] * inv_smax[v], f1 = r1[v] * inv_smax[v];
        *reinterpret_cast<uint32_t*>(&s.probs[v][g][col]) = PackF16(a.x * f0, a.y * f1);
        *reinterpret_cast<uint32_t*>(&s.probs[v][g + 8][col]) = PackF16(c.x * f0, c.y * f1);
      }
      sum_lo += a.x + a.y;
      sum_hi += c.x + c.y;
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      sum_lo += __shfl_xor_sync(0xffffffffu, sum_lo, off);
      sum_hi += __shfl_xor_sync(0xffffffffu, sum_hi, off);
    }
    if (tq == 0) {
      s.rsum[warp][g] = sum_lo;
      s.rsum[warp][g + 8] = sum_hi;
    }
    __syncthreads();

    const float unit = s.smax[warp] * (1.0f / kPScale);
    const float alpha_lo = exp2f(m_lo - new_lo), alpha_hi = exp2f(m_hi - new_hi);
    m_lo = new_lo;
    m_hi = new_hi;
    float tsum_lo = 0.0f, tsum_hi = 0.0f;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) {
      tsum_lo += s.rsum[v][g];
      tsum_hi += s.rsum[v][g + 8];
    }
    l_lo = l_lo * alpha_lo + tsum_lo;
    l_hi = l_hi * alpha_hi + tsum_hi;
    // o in units of this tile's smax from here: alpha times old unit / new unit.
    const float to_unit = o_unit / unit;
    o_unit = unit;
    const float r_lo = alpha_lo * to_unit, r_hi = alpha_hi * to_unit;
#pragma unroll
    for (int j = 0; j < 2 * kVChunks; ++j) {
      o[j][0] *= r_lo, o[j][1] *= r_lo, o[j][2] *= r_hi, o[j][3] *= r_hi;
    }
    // O[:, group `warp`] += P'[16, tile] · V[tile, 128]: a k-step of 16 tokens,
    // two 16-dim chunks an ldmatrix.
#pragma unroll
    for (int kk = 0; kk < kTileTokens / 16; ++kk) {
      uint32_t pf[4];
      Ldmatrix4(pf, &s.probs[warp][(lm_m & 1) * 8 + lm_r][kk * 16 + (lm_m >> 1) * 8]);
#pragma unroll
      for (int c = 0; c < kVChunks; c += 2) {
        uint32_t v[4];  // v[2q]: tokens 2tq, 2tq + 1 of the step's first 8, chunk c + q; v[2q + 1]:
                        // the next 8
        Ldmatrix4Trans(
            v, &rows[kk * 16 + (lm_m & 1) * 8 + lm_r][warp * kGroup + (c + (lm_m >> 1)) * 16]);
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          // Bytes: (t, 2g), (t, 2g + 1), (t + 1, 2g), (t + 1, 2g + 1) -> even pair, odd pair.
          const uint32_t lo = __byte_perm(v[2 * q], 0, 0x3120);
          const uint32_t hi = __byte_perm(v[2 * q + 1], 0, 0x3120);
          MmaF16(o[2 * (c + q)], pf, fp8kv::CodesToF16x2(lo), fp8kv::CodesToF16x2(hi));
          MmaF16(o[2 * (c + q) + 1], pf, fp8kv::CodesToF16x2(lo >> 16),
                 fp8kv::CodesToF16x2(hi >> 16));
        }
      }
    }
    __syncthreads();  // the stage, scores and probabilities are free again
    if (warp == 0 && i + kStages < n) IssueTile<C>(s, p, b, tile + kStages, stage, seq_len, lane);
  }

  // Epilogue: rows g and g + 8, dims 16c + 4tq .. + 3 of this warp's group.
  const float inv_lo = l_lo > 0.0f ? o_unit / l_lo : 0.0f;
  const float inv_hi = l_hi > 0.0f ? o_unit / l_hi : 0.0f;
  const float lse_lo = n > 0 ? m_lo + log2f(l_lo) : -INFINITY;
  const float lse_hi = n > 0 ? m_hi + log2f(l_hi) : -INFINITY;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int h = head0 + g + half * 8;
    if (h >= p.num_heads) continue;
    const float inv = half ? inv_hi : inv_lo;
    const float lse2 = half ? lse_hi : lse_lo;
    const int64_t bh = static_cast<int64_t>(b) * p.num_heads + h;
    const int e0 = 2 * half, e1 = 2 * half + 1;
    if constexpr (kSplit) {
      float* part = SplitPartial(p, b, split, h) + warp * kGroup + 4 * tq;
#pragma unroll
      for (int c = 0; c < kVChunks; ++c) {
        *reinterpret_cast<float4*>(part + c * 16) = make_float4(
            o[2 * c][e0] * inv, o[2 * c + 1][e0] * inv, o[2 * c][e1] * inv, o[2 * c + 1][e1] * inv);
      }
      if (warp == 0 && tq == 0) *SplitLse(p, b, split, h) = lse2;
    } else {
      OutT* out = static_cast<OutT*>(p.out) + bh * kLatentDim + warp * kGroup + 4 * tq;
#pragma unroll
      for (int c = 0; c < kVChunks; ++c) {
        const float x0 = o[2 * c][e0] * inv, x1 = o[2 * c + 1][e0] * inv;
        const float x2 = o[2 * c][e1] * inv, x3 = o[2 * c + 1][e1] * inv;
        if constexpr (std::is_same_v<OutT, float>) {
          *reinterpret_cast<float4*>(out + c * 16) = make_float4(x0, x1, x2, x3);
        } else {
          *reinterpret_cast<uint2*>(out + c * 16) = make_uint2(PackBf16(x0, x1), PackBf16(x2, x3));
        }
      }
      if (p.lse != nullptr && warp == 0 && tq == 0) p.lse[bh] = lse2 * 0.6931471805599453f;
    }
  }
}

template <typename C, bool kSplit, typename OutT>
absl::Status LaunchDecode(const MlaDecodeParams& p, dim3 grid) {
  constexpr auto kernel = MlaDecodeFp8Kernel<C, kSplit, OutT>;
  RETURN_IF_ERROR(AllowDynamicSmem<kernel>(static_cast<int>(sizeof(typename C::Smem))));
  RETURN_IF_ERROR(LaunchPdl("MlaDecodeFp8Kernel", kernel, grid, kThreads, sizeof(typename C::Smem),
                            p.stream, p));
  return LaunchStatus("MlaDecodeFp8Kernel");
}

// Calls f(Fp8Cfg<...>{}) for the 16-head tile configuration `t` names.
template <typename F>
auto WithTile(MlaTileConfig t, F&& f) {
  switch (t) {
    case MlaTileConfig::kTokens32Stages4:
      return f(Fp8Cfg<32, 4>{});
    case MlaTileConfig::kTokens32Stages5:
      return f(Fp8Cfg<32, 5>{});
    case MlaTileConfig::kTokens32Stages2:
      return f(Fp8Cfg<32, 2>{});
    case MlaTileConfig::kDefault:
    case MlaTileConfig::kTokens64Stages2:
    case MlaTileConfig::kHeads64Tokens64Stages2:
      break;
  }
  return f(Fp8Cfg<64, 2>{});
}

}  // namespace

Fp8TileShape MlaFp8TileShape(MlaTileConfig t) {
  return WithTile(t, [](auto cfg) {
    using C = decltype(cfg);
    return Fp8TileShape{C::kTileTokens, C::kCtasPerSm};
  });
}

absl::Status LaunchMlaDecodeFp8(const MlaDecodeParams& p, MlaTileConfig t) {
  const dim3 grid(p.num_splits, (p.num_heads + kHeadsPerBlock - 1) / kHeadsPerBlock, p.batch);
  const bool split = p.num_splits > 1;
  return WithTile(t, [&](auto cfg) {
    using C = decltype(cfg);
    if (p.out_type == OutType::kFloat32) {
      return split ? LaunchDecode<C, true, float>(p, grid) : LaunchDecode<C, false, float>(p, grid);
    }
    return split ? LaunchDecode<C, true, bf16>(p, grid) : LaunchDecode<C, false, bf16>(p, grid);
  });
}

}  // namespace moesh::cuda::mla
