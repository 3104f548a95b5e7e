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
// (Query tile, head) pairs in PrefillTileOf's order (mla_prefill_common.cuh):
// a few heads at a time, query tiles longest first.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>

#include "base/status.h"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/mla_prefill.h"
#include "kernels/cuda/mla_prefill_common.cuh"
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
constexpr int kOTiles = kVDim / 8;         // 16 n-tiles of O
static_assert(kQkChunks % 8 == 0 && kVChunks % 8 == 0, "the swizzle permutes groups of 8 chunks");
static_assert(kTileK % 16 == 0 && kTileQ == 16 * kWarps);

struct Smem {
  bf16 k[2][kTileK][kQkDim];
  bf16 v[2][kTileK][kVDim];
};
// 80 KB: two CTAs an SM (registers allow two: 220 a thread, ptxas sm_90a).
static_assert(sizeof(Smem) * 2 + 2048 <= 233472);

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
    CpAsync16(sk + SwizzledChunk(r, ch, kQkDim), src, ok);
  }
#pragma unroll 4
  for (int c = threadIdx.x; c < kTileK * kVChunks; c += kThreads) {
    const int r = c / kVChunks, ch = c % kVChunks, j = j0 + r;
    const bool ok = j < p.num_k;
    const bf16* src =
        ok ? p.v + j * p.kv_ld + static_cast<int64_t>(h) * p.kv_head_stride + ch * 8 : p.v;
    CpAsync16(sv + SwizzledChunk(r, ch, kVDim), src, ok);
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

__global__ void __launch_bounds__(kThreads, 2) MlaPrefillKernel(MlaPrefillParams p, int group) {
  extern __shared__ __align__(128) uint8_t smem_raw[];
  Smem& s = *reinterpret_cast<Smem*>(smem_raw);
  const PrefillTile tile =
      PrefillTileOf(blockIdx.x, (p.num_q + kTileQ - 1) / kTileQ, p.num_heads, group);
  const int qt = tile.qt, h = tile.h;
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
  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
  RowState st;
  // ldmatrix lane roles: row within an 8x8 matrix, and which of the four.
  const int lm_r = lane & 7, lm_m = lane >> 3;

  for (int kt = 0; kt < n_kt; ++kt) {
    const int stage = kt & 1;
    if (kt + 1 < n_kt) {
      LoadKvTile(s, p, h, kt + 1, stage ^ 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();  // tile kt is in `stage` for every warp

    // S = Q·K^T: matrices (keys +0/+8 by lm_m >> 1) × (dims +0/+8 by lm_m & 1)
    // give b0, b1 of n-tile 2 np and of 2 np + 1.
    float sc[kSRegs];
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) sc[i] = 0.0f;
    const bf16* sk = &s.k[stage][0][0];
#pragma unroll
    for (int kk = 0; kk < kQkSteps; ++kk) {
#pragma unroll
      for (int np = 0; np < kSTiles / 2; ++np) {
        const int row = np * 16 + (lm_m >> 1) * 8 + lm_r;
        uint32_t b[4];
        Ldmatrix4(b, sk + SwizzledChunk(row, kk * 2 + (lm_m & 1), kQkDim));
        Mma(*reinterpret_cast<float(*)[4]>(&sc[8 * np]), qf[kk], b[0], b[1]);
        Mma(*reinterpret_cast<float(*)[4]>(&sc[8 * np + 4]), qf[kk], b[2], b[3]);
      }
    }

    // Masked where some row cannot see some key (j > diag + r or j >= num_k).
    const int j0 = kt * kTileK;
    const bool masked = j0 + kTileK - 1 > diag + i0 || j0 + kTileK > p.num_k;
    uint32_t pa[kPvSteps][4];
    SoftmaxTile(sc, o, pa, st, masked, j0, p.num_k, diag + r_lo, diag + r_hi, tq, scale_log2);

    // O += P·V: matrices (keys +0/+8 by lm_m & 1) × (dims +0/+8 by lm_m >> 1),
    // transposed, give b0, b1 of n-tile 2 dp and of 2 dp + 1.
    const bf16* sv = &s.v[stage][0][0];
#pragma unroll
    for (int kk = 0; kk < kPvSteps; ++kk) {
#pragma unroll
      for (int dp = 0; dp < kOTiles / 2; ++dp) {
        const int row = kk * 16 + (lm_m & 1) * 8 + lm_r;
        uint32_t b[4];
        Ldmatrix4Trans(b, sv + SwizzledChunk(row, dp * 2 + (lm_m >> 1), kVDim));
        Mma(*reinterpret_cast<float(*)[4]>(&o[8 * dp]), pa[kk], b[0], b[1]);
        Mma(*reinterpret_cast<float(*)[4]>(&o[8 * dp + 4]), pa[kk], b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with `stage` before tile kt + 2 lands in it
  }
  FinishRows(p, h, r_lo, tq, o, st);
}

bool Aligned(const void* ptr, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

}  // namespace

absl::StatusOr<int> mla_prefill::PrefillHeadsPerGroup(const MlaPrefillParams& p) {
  ASSIGN_OR_RETURN(const DeviceInfo device, CurrentDeviceInfo());
  const int64_t head_bytes = std::max<int64_t>(1, int64_t{p.num_k} * (kNopeDim + kVDim) * 2);
  return static_cast<int>(
      std::clamp<int64_t>(int64_t{device.l2_bytes} * 3 / 4 / head_bytes, 1, p.num_heads));
}

absl::Status RunMlaPrefill(const MlaPrefillParams& p) {
  if (p.num_q < 0 || p.num_k < 0 || p.num_heads < 1 || (p.num_q + kTileQ - 1) / kTileQ > 65535 ||
      int64_t{(p.num_q + kTileQ - 1) / kTileQ} * p.num_heads > INT_MAX) {
    return absl::InvalidArgumentError(
        "RunMlaPrefill: need num_heads >= 1, 0 <= num_q <= 65535 * 64, num_k >= 0 and at most "
        "2^31 - 1 (64-query tile, head) pairs");
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
  if (p.impl == MlaPrefillImpl::kWgmma) return LaunchMlaPrefillWgmma(p);
  RETURN_IF_ERROR(AllowDynamicSmem<MlaPrefillKernel>(static_cast<int>(sizeof(Smem))));
  ASSIGN_OR_RETURN(const int group, PrefillHeadsPerGroup(p));
  const int grid = (p.num_q + kTileQ - 1) / kTileQ * p.num_heads;
  MlaPrefillKernel<<<grid, kThreads, sizeof(Smem), p.stream>>>(p, group);
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
