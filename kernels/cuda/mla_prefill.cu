// MLA prefill attention, expanded form (MlaPrefillParams), FlashAttention-2
// style. One CTA = (64 queries, head), four warps of 16 query rows:
//   * the warp's Q rows [16, 192] stay in registers as mma A fragments;
//   * K [64 keys, 192] and V [64 keys, 128] tiles stream through two
//     shared-memory stages with 16-byte cp.async (rows past num_k zeroed),
//     16-byte chunks XOR-swizzled by row (chunk c of row r at c ^ (r & 7))
//     so every ldmatrix is conflict-free;
//   * S = Q·K^T (mma.m16n8k16, K fragments by ldmatrix), the causal mask on
//     the tiles that cross the diagonal or the end of the keys, online
//     softmax in fp32 (base 2); P rounded to bf16 stays in registers as the
//     A fragments of O += P·V (V fragments by ldmatrix.trans);
//   * the epilogue writes O / l in bf16 and the log2-sum-exp, or merges them
//     into an earlier key range's (`merge`).
// Query tiles run longest first (the last tile sees the most keys).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "base/status.h"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/mla_prefill.h"
#include "kernels/cuda/mma.cuh"

namespace moesh::cuda {
namespace {

using namespace mla_prefill;               // NOLINT: the tile constants
constexpr int kNopeChunks = kNopeDim / 8;  // 16-byte chunks of a K row's no-rope part
constexpr int kQkChunks = kQkDim / 8;      // 24 a K row
constexpr int kVChunks = kVDim / 8;        // 16 a V row
constexpr int kQkSteps = kQkDim / 16;      // 12 mma k-steps of S
constexpr int kNopeSteps = kNopeDim / 16;  // the first 8 of them read q_nope
constexpr int kSTiles = kTileK / 8;        // 8 n-tiles of S
constexpr int kPvSteps = kTileK / 16;      // 4 mma k-steps of P·V
constexpr int kOTiles = kVDim / 8;         // 16 n-tiles of O
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kQkChunks % 8 == 0 && kVChunks % 8 == 0, "the swizzle permutes groups of 8 chunks");
static_assert(kTileK % 16 == 0 && kTileQ == 16 * kWarps);

struct Smem {
  bf16 k[2][kTileK][kQkDim];
  bf16 v[2][kTileK][kVDim];
};
// 80 KB: two CTAs an SM (registers allow two: 220 a thread, ptxas sm_90a).
static_assert(sizeof(Smem) * 2 + 2048 <= 233472);

// Element offset of chunk `c` (8 bf16) of row `r` in a swizzled tile of
// `width` elements a row.
__device__ __forceinline__ int Swz(int r, int c, int width) {
  return r * width + ((c ^ (r & 7)) << 3);
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Key tile `kt` (keys [64 kt, 64 kt + 64) of the call) of head h into `stage`.
__device__ __forceinline__ void LoadKvTile(Smem& s, const MlaPrefillParams& p, int h, int kt,
                                           int stage) {
  const int j0 = kt * kTileK;
  bf16* sk = &s.k[stage][0][0];
  bf16* sv = &s.v[stage][0][0];
#pragma unroll 4
  for (int c = threadIdx.x; c < kTileK * kQkChunks; c += kThreads) {
    const int r = c / kQkChunks, ch = c % kQkChunks, j = j0 + r;
    const bool ok = j < p.num_k;
    const bf16* src = p.k_pe;  // read nothing where !ok
    if (ok) {
      src = ch < kNopeChunks
                ? p.k_nope + j * p.kv_ld + static_cast<int64_t>(h) * p.kv_head_stride + ch * 8
                : p.k_pe + j * p.k_pe_ld + (ch - kNopeChunks) * 8;
    }
    CpAsync16(sk + Swz(r, ch, kQkDim), src, ok);
  }
#pragma unroll 4
  for (int c = threadIdx.x; c < kTileK * kVChunks; c += kThreads) {
    const int r = c / kVChunks, ch = c % kVChunks, j = j0 + r;
    const bool ok = j < p.num_k;
    const bf16* src =
        ok ? p.v + j * p.kv_ld + static_cast<int64_t>(h) * p.kv_head_stride + ch * 8 : p.v;
    CpAsync16(sv + Swz(r, ch, kVDim), src, ok);
  }
}

// The A fragment word of query row r at dims [d, d + 2) (zeros past num_q).
__device__ __forceinline__ uint32_t QWord(const MlaPrefillParams& p, int h, int r, int d) {
  if (r >= p.num_q) return 0u;
  const bf16* src =
      d < kNopeDim
          ? p.q_nope + r * p.q_nope_ld + static_cast<int64_t>(h) * p.q_nope_head_stride + d
          : p.q_pe + r * p.q_pe_ld + static_cast<int64_t>(h) * p.q_pe_head_stride + (d - kNopeDim);
  return *reinterpret_cast<const uint32_t*>(src);
}

// Row r's earlier log2-sum-exp (p.merge), read before any lane of the warp
// writes the row's new one.
__device__ __forceinline__ float PrevLse(const MlaPrefillParams& p, int h, int r) {
  return p.merge && r < p.num_q ? p.lse[static_cast<int64_t>(r) * p.num_heads + h] : -INFINITY;
}

// Row `r`'s result: O / l with log2-sum-exp `lse2`, merged with the earlier
// ranges' (log2-sum-exp `prev`) if p.merge. `o` holds this thread's 2 values
// of each n-tile (dims 8 j + 2 tq, + 1).
__device__ __forceinline__ void StoreRow(const MlaPrefillParams& p, int h, int r, int tq,
                                         const float (&o)[kOTiles][2], float l, float lse2,
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
  for (int j = 0; j < kOTiles; ++j) {
    float a = o[j][0] * w_new, b = o[j][1] * w_new;
    if (p.merge) {
      const __nv_bfloat162 old = *reinterpret_cast<const __nv_bfloat162*>(out + 8 * j);
      a += w_old * __low2float(old);
      b += w_old * __high2float(old);
    }
    *reinterpret_cast<uint32_t*>(out + 8 * j) = PackBf16(a, b);
  }
  if (p.lse != nullptr && tq == 0) p.lse[static_cast<int64_t>(r) * p.num_heads + h] = total;
}

__global__ void __launch_bounds__(kThreads, 2) MlaPrefillKernel(MlaPrefillParams p) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  // Query tiles on the slow grid axis, the last (longest) first over all heads.
  const int qt = gridDim.y - 1 - blockIdx.y, h = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;  // mma fragment row group / thread in group
  const int i0 = qt * kTileQ;
  // Key j is visible to query i iff j <= diag + i.
  const int diag = p.q_pos0 - p.k_pos0;
  const int seen = max(0, min(p.num_k, diag + min(i0 + kTileQ, p.num_q)));
  const int n_kt = (seen + kTileK - 1) / kTileK;

  if (n_kt > 0) LoadKvTile(s, p, h, 0, 0);
  CpAsyncCommit();

  const int r_lo = i0 + warp * 16 + g, r_hi = r_lo + 8;
  uint32_t qf[kQkSteps][4];
#pragma unroll
  for (int kk = 0; kk < kQkSteps; ++kk) {
    const int d = kk * 16 + 2 * tq;
    qf[kk][0] = QWord(p, h, r_lo, d);
    qf[kk][1] = QWord(p, h, r_hi, d);
    qf[kk][2] = QWord(p, h, r_lo, d + 8);
    qf[kk][3] = QWord(p, h, r_hi, d + 8);
  }
  static_assert(kNopeSteps * 16 == kNopeDim, "a k-step reads one part");

  const float scale_log2 = p.softmax_scale * kLog2e;
  float o[kOTiles][4];
#pragma unroll
  for (int j = 0; j < kOTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;  // this thread's part of l
  // ldmatrix lane roles: row within an 8x8 matrix, and which of the four.
  const int lm_r = lane & 7, lm_m = lane >> 3;

  for (int kt = 0; kt < n_kt; ++kt) {
    const int st = kt & 1;
    if (kt + 1 < n_kt) {
      LoadKvTile(s, p, h, kt + 1, st ^ 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();  // tile kt is in `st` for every warp

    // S = Q·K^T: matrices (keys +0/+8 by lm_m >> 1) × (dims +0/+8 by lm_m & 1)
    // give b0, b1 of n-tile 2 np and of 2 np + 1.
    float sc[kSTiles][4];
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
    const bf16* sk = &s.k[st][0][0];
#pragma unroll
    for (int kk = 0; kk < kQkSteps; ++kk) {
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        const int row = np * 16 + (lm_m >> 1) * 8 + lm_r;
        uint32_t b[4];
        Ldmatrix4(b, sk + Swz(row, kk * 2 + (lm_m & 1), kQkDim));
        Mma(sc[2 * np], qf[kk], b[0], b[1]);
        Mma(sc[2 * np + 1], qf[kk], b[2], b[3]);
      }
    }

    // Scale to base 2; mask what row r cannot see (j > diag + r or j >= num_k).
    const int j0 = kt * kTileK;
    const bool masked = j0 + kTileK - 1 > diag + i0 || j0 + kTileK > p.num_k;
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = sc[nt][e] * scale_log2;
        if (masked) {
          const int j = j0 + nt * 8 + 2 * tq + (e & 1);
          const int r = e < 2 ? r_lo : r_hi;
          if (j >= p.num_k || j > diag + r) v = -INFINITY;
        }
        sc[nt][e] = v;
      }
    }
    float mx_lo = m_lo, mx_hi = m_hi;
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
      mx_lo = fmaxf(mx_lo, fmaxf(sc[nt][0], sc[nt][1]));
      mx_hi = fmaxf(mx_hi, fmaxf(sc[nt][2], sc[nt][3]));
    }
#pragma unroll
    for (int off = 1; off < 4; off <<= 1) {  // the quad holding the row
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
    }
    // A row with no visible key yet keeps max -inf: subtract 0 instead (its
    // probabilities are exp2(-inf) = 0, and alpha multiplies zeros).
    const float base_lo = mx_lo == -INFINITY ? 0.0f : mx_lo;
    const float base_hi = mx_hi == -INFINITY ? 0.0f : mx_hi;
    const float alpha_lo = exp2f(m_lo - base_lo), alpha_hi = exp2f(m_hi - base_hi);
    m_lo = mx_lo, m_hi = mx_hi;

    // P in bf16 as the A fragments of P·V (n-tile 2 kk and 2 kk + 1 are
    // k-step kk's keys [0, 8) and [8, 16)); l sums the rounded values.
    uint32_t pa[kPvSteps][4];
    float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
    for (int nt = 0; nt < kSTiles; ++nt) {
      const uint32_t lo = PackBf16(exp2f(sc[nt][0] - base_lo), exp2f(sc[nt][1] - base_lo));
      const uint32_t hi = PackBf16(exp2f(sc[nt][2] - base_hi), exp2f(sc[nt][3] - base_hi));
      const __nv_bfloat162 lo2 = *reinterpret_cast<const __nv_bfloat162*>(&lo);
      const __nv_bfloat162 hi2 = *reinterpret_cast<const __nv_bfloat162*>(&hi);
      sum_lo += __low2float(lo2) + __high2float(lo2);
      sum_hi += __low2float(hi2) + __high2float(hi2);
      pa[nt / 2][(nt & 1) * 2 + 0] = lo;
      pa[nt / 2][(nt & 1) * 2 + 1] = hi;
    }
    l_lo = l_lo * alpha_lo + sum_lo;
    l_hi = l_hi * alpha_hi + sum_hi;
#pragma unroll
    for (int j = 0; j < kOTiles; ++j) {
      o[j][0] *= alpha_lo, o[j][1] *= alpha_lo;
      o[j][2] *= alpha_hi, o[j][3] *= alpha_hi;
    }

    // O += P·V: matrices (keys +0/+8 by lm_m & 1) × (dims +0/+8 by lm_m >> 1),
    // transposed, give b0, b1 of n-tile 2 dp and of 2 dp + 1.
    const bf16* sv = &s.v[st][0][0];
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
#pragma unroll
      for (int dp = 0; dp < kOTiles / 2; ++dp) {
        const int row = kk * 16 + (lm_m & 1) * 8 + lm_r;
        uint32_t b[4];
        Ldmatrix4Trans(b, sv + Swz(row, dp * 2 + (lm_m >> 1), kVDim));
        Mma(o[2 * dp], pa[kk], b[0], b[1]);
        Mma(o[2 * dp + 1], pa[kk], b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with `st` before tile kt + 2 lands in it
  }

#pragma unroll
  for (int off = 1; off < 4; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  float lo[kOTiles][2], hi[kOTiles][2];
#pragma unroll
  for (int j = 0; j < kOTiles; ++j) {
    lo[j][0] = o[j][0], lo[j][1] = o[j][1];
    hi[j][0] = o[j][2], hi[j][1] = o[j][3];
  }
  const float prev_lo = PrevLse(p, h, r_lo), prev_hi = PrevLse(p, h, r_hi);
  __syncwarp();  // the quads' reads of lse before any of its writes
  StoreRow(p, h, r_lo, tq, lo, l_lo, l_lo > 0.0f ? m_lo + log2f(l_lo) : -INFINITY, prev_lo);
  StoreRow(p, h, r_hi, tq, hi, l_hi, l_hi > 0.0f ? m_hi + log2f(l_hi) : -INFINITY, prev_hi);
}

bool Aligned(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

}  // namespace

absl::Status RunMlaPrefill(const MlaPrefillParams& p) {
  if (p.num_q < 0 || p.num_k < 0 || p.num_heads < 1 || (p.num_q + kTileQ - 1) / kTileQ > 65535) {
    return absl::InvalidArgumentError(
        "RunMlaPrefill: need num_heads >= 1, 0 <= num_q <= 65535 * 64, num_k >= 0");
  }
  if (!p.q_nope || !p.q_pe || !p.k_nope || !p.v || !p.k_pe || !p.out || (p.merge && !p.lse)) {
    return absl::InvalidArgumentError("RunMlaPrefill: null pointer (lse is needed to merge)");
  }
  if (!Aligned(p.k_nope, 16) || !Aligned(p.v, 16) || !Aligned(p.k_pe, 16) || p.kv_ld % 8 != 0 ||
      p.kv_head_stride % 8 != 0 || p.k_pe_ld % 8 != 0) {
    return absl::InvalidArgumentError(
        "RunMlaPrefill: k_nope, v, k_pe must be 16-byte aligned, kv_ld, kv_head_stride, k_pe_ld "
        "multiples of 8");
  }
  if (!Aligned(p.q_nope, 4) || !Aligned(p.q_pe, 4) || !Aligned(p.out, 4) || p.q_nope_ld % 2 != 0 ||
      p.q_pe_ld % 2 != 0 || p.q_nope_head_stride % 2 != 0 || p.q_pe_head_stride % 2 != 0 ||
      p.out_ld % 2 != 0 || p.out_head_stride % 2 != 0) {
    return absl::InvalidArgumentError(
        "RunMlaPrefill: q_nope, q_pe, out must be 4-byte aligned with even strides");
  }
  if (p.num_q == 0) return absl::OkStatus();
  RETURN_IF_ERROR(AllowDynamicSmem<MlaPrefillKernel>(static_cast<int>(sizeof(Smem))));
  const dim3 grid(p.num_heads, (p.num_q + kTileQ - 1) / kTileQ);
  MlaPrefillKernel<<<grid, kThreads, sizeof(Smem), p.stream>>>(p);
  return LaunchStatus("MlaPrefillKernel");
}

double MlaPrefillFlops(int num_q, int num_k, int num_heads, int q_pos0, int k_pos0) {
  const int64_t diag = static_cast<int64_t>(q_pos0) - k_pos0;
  int64_t pairs = 0;
  for (int i = 0; i < num_q; ++i) {
    pairs += std::max<int64_t>(0, std::min<int64_t>(num_k, diag + i + 1));
  }
  return 2.0 * (mla_prefill::kQkDim + mla_prefill::kVDim) * static_cast<double>(pairs) * num_heads;
}

}  // namespace moesh::cuda
