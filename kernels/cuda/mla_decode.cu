// MLA decode over the paged latent cache. One CTA = (KV split, group of 16
// heads, sequence), four warps:
//   * warp 0 streams the split's cache blocks into a two-stage shared-memory
//     ring, one cp.async.bulk per 1152-byte row (rows padded to 1168 bytes so
//     ldmatrix is conflict-free), completing on an mbarrier per stage;
//   * S = Q·K^T: warp w owns dims [144w, 144w + 144) of the 576 (Q slice in
//     registers), partial scores meet in shared memory;
//   * online softmax in fp32 (base 2), P rounded to bf16 in shared memory;
//   * O += P·V: warp w owns latent dims [128w, 128w + 128).
// Splits write (O / l, log2-sum-exp) partials; MlaCombineKernel merges them.
// An FP8 cache (KvCacheDtype::kFp8) runs mla_decode_fp8.cu's kernel.
#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mla_decode.h"
#include "kernels/cuda/mla_decode_common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pdl.cuh"

namespace moesh::cuda {
namespace {

using namespace mla;                          // NOLINT: the tile constants
constexpr int kRowBytes = kHeadDim * 2;       // 1152, one cached token
constexpr int kQkSlice = kHeadDim / kWarps;   // 144 dims of q·k per warp
constexpr int kQkSteps = kQkSlice / 16;       // 9 mma k-steps
constexpr int kVSlice = kLatentDim / kWarps;  // 128 output dims per warp
constexpr int kVTiles = kVSlice / 8;          // 16 mma n-tiles
static_assert(kQkSlice % 16 == 0 && kVSlice % 16 == 0);

// A tile of kTile tokens (a cache block or an aligned part of one), kStages
// of them in flight.
template <int kTile, int kStages>
struct Cfg {
  static constexpr int kTileTokens = kTile;
  static constexpr int kNumStages = kStages;
  static constexpr int kTilesPerBlock = kKvBlockSize / kTile;
  static constexpr int kSTiles = kTile / 8;     // mma n-tiles of scores
  static constexpr int kOwnTiles = kTile / 32;  // n-tiles each warp finishes
  static constexpr int kPitch = kTile + 8;      // conflict-free score/prob rows
  static_assert(kTile % 32 == 0 && kKvBlockSize % kTile == 0);

  struct Smem {
    bf16 kv[kStages][kTile][kRowPitch];
    float spart[kWarps][kHeadsPerBlock][kPitch];
    bf16 probs[kHeadsPerBlock][kPitch];
    float rmax[kWarps][kHeadsPerBlock];
    float rsum[kWarps][kHeadsPerBlock];
    alignas(8) uint64_t bar[kStages];
  };
  static_assert(sizeof(Smem) <= 227 * 1024, "over Hopper's shared memory per CTA");
  // 228 KB per SM, 1 KB of it reserved per resident CTA.
  static constexpr int kCtasPerSm = 233472 / (sizeof(Smem) + 1024);
};

// Row t of sequence b's rows (t < seq_len): cache position t, or with a
// selection (kv_index) position kv_index[b, t]; kv_row_stride apart.
__device__ __forceinline__ const bf16* SelectedRow(const MlaDecodeParams& p, int b, int t) {
  const int pos =
      p.kv_index != nullptr ? p.kv_index[static_cast<int64_t>(b) * p.kv_index_stride + t] : t;
  const int block =
      p.block_table[static_cast<int64_t>(b) * p.max_blocks_per_seq + pos / kKvBlockSize];
  return p.kv_cache +
         (static_cast<int64_t>(block) * kKvBlockSize + pos % kKvBlockSize) * p.kv_row_stride;
}

// Warp 0: starts the copy of the sequence's tile `tile` into `stage`. Rows past
// the sequence's end are zeroed instead (their probabilities are 0, and 0 · NaN
// of stale shared memory would poison O). Dense rows (no selection, stride
// 576) come from one cache block; selected or strided rows each find their
// own (SelectedRow).
template <typename C>
__device__ __forceinline__ void IssueTile(typename C::Smem& s, const MlaDecodeParams& p, int b,
                                          int tile, int stage, int seq_len, int lane) {
  constexpr int kTile = C::kTileTokens;
  const bool dense = p.kv_index == nullptr && p.kv_row_stride == kHeadDim;
  const int block =
      dense
          ? p.block_table[static_cast<int64_t>(b) * p.max_blocks_per_seq + tile / C::kTilesPerBlock]
          : 0;
  const int valid = min(kTile, seq_len - tile * kTile);
  const bf16* src =
      p.kv_cache +
      (static_cast<int64_t>(block) * kKvBlockSize + (tile % C::kTilesPerBlock) * kTile) * kHeadDim;
  for (int r = valid + lane; r < kTile; r += 32) {
    uint4* row = reinterpret_cast<uint4*>(&s.kv[stage][r][0]);
    for (int c = 0; c < kRowBytes / 16; ++c) row[c] = make_uint4(0, 0, 0, 0);
  }
  __syncwarp();  // the zeroed rows before the stage's arrival
  if (lane == 0) MbarArriveExpectTx(&s.bar[stage], valid * kRowBytes);
  __syncwarp();
  for (int r = lane; r < valid; r += 32) {
    const bf16* row =
        dense ? src + static_cast<int64_t>(r) * kHeadDim : SelectedRow(p, b, tile * kTile + r);
    BulkCopyG2S(&s.kv[stage][r][0], row, kRowBytes, &s.bar[stage]);
  }
}

template <typename C, bool kSplit, typename OutT>
__global__ void __launch_bounds__(kThreads, 1) MlaDecodeKernel(MlaDecodeParams p) {
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

  // This warp's Q slice, [16 heads, 144 dims], as mma A fragments.
  uint32_t qf[kQkSteps][4];
  {
    const int h_lo = head0 + g, h_hi = head0 + g + 8;
    const bf16* q_lo =
        p.q + (static_cast<int64_t>(b) * p.num_heads + h_lo) * kHeadDim + warp * kQkSlice + 2 * tq;
    const bf16* q_hi = q_lo + 8 * kHeadDim;
#pragma unroll
    for (int kk = 0; kk < kQkSteps; ++kk) {
      const int d = kk * 16;
      qf[kk][0] = h_lo < p.num_heads ? *reinterpret_cast<const uint32_t*>(q_lo + d) : 0u;
      qf[kk][1] = h_hi < p.num_heads ? *reinterpret_cast<const uint32_t*>(q_hi + d) : 0u;
      qf[kk][2] = h_lo < p.num_heads ? *reinterpret_cast<const uint32_t*>(q_lo + d + 8) : 0u;
      qf[kk][3] = h_hi < p.num_heads ? *reinterpret_cast<const uint32_t*>(q_hi + d + 8) : 0u;
    }
  }
  const float scale_log2 = p.softmax_scale * kLog2e;

  float o[kVTiles][4];
#pragma unroll
  for (int j = 0; j < kVTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;  // rows g, g + 8
  __syncthreads();  // zero-filled rows of the first tiles are visible

  // ldmatrix lane roles: row within an 8x8 matrix, and which of the four.
  const int lm_r = lane & 7, lm_m = lane >> 3;

  for (int i = 0; i < n; ++i) {
    const int stage = i % kStages;
    const int tile = range.begin + i;
    MbarWait(&s.bar[stage], (i / kStages) & 1);
    const bf16(*kv)[kRowPitch] = s.kv[stage];  // [kTileTokens][kRowPitch]

    // Partial scores over this warp's dims: [16 heads, 64 tokens].
    float sc[kSTiles][4];
#pragma unroll
    for (int j = 0; j < kSTiles; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kQkSteps; ++kk) {
      const int d = warp * kQkSlice + kk * 16 + (lm_m & 1) * 8;
#pragma unroll
      for (int j = 0; j < kSTiles; j += 2) {
        uint32_t bfrag[4];
        Ldmatrix4(bfrag, &kv[j * 8 + (lm_m >> 1) * 8 + lm_r][d]);
        Mma(sc[j], qf[kk], bfrag[0], bfrag[1]);
        Mma(sc[j + 1], qf[kk], bfrag[2], bfrag[3]);
      }
    }
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
    float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
    for (int jj = 0; jj < C::kOwnTiles; ++jj) {
      const int col = warp * (kTileTokens / 4) + jj * 8 + 2 * tq;
      const uint32_t plo = PackBf16(exp2f(st[jj][0] - new_lo), exp2f(st[jj][1] - new_lo));
      const uint32_t phi = PackBf16(exp2f(st[jj][2] - new_hi), exp2f(st[jj][3] - new_hi));
      *reinterpret_cast<uint32_t*>(&s.probs[g][col]) = plo;
      *reinterpret_cast<uint32_t*>(&s.probs[g + 8][col]) = phi;
      // Sum what P·V will use: the rounded probabilities.
      const float2 a = UnpackBf16(plo), c = UnpackBf16(phi);
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
#pragma unroll
    for (int j = 0; j < kVTiles; ++j) {
      o[j][0] *= alpha_lo, o[j][1] *= alpha_lo, o[j][2] *= alpha_hi, o[j][3] *= alpha_hi;
    }
    // O[:, this warp's 128 dims] += P[16, 64] · V[64, 128].
#pragma unroll
    for (int kk = 0; kk < kTileTokens / 16; ++kk) {
      uint32_t pf[4];
      Ldmatrix4(pf, &s.probs[(lm_m & 1) * 8 + lm_r][kk * 16 + (lm_m >> 1) * 8]);
#pragma unroll
      for (int j = 0; j < kVTiles; j += 2) {
        uint32_t vf[4];
        Ldmatrix4Trans(
            vf, &kv[kk * 16 + (lm_m & 1) * 8 + lm_r][warp * kVSlice + j * 8 + (lm_m >> 1) * 8]);
        Mma(o[j], pf, vf[0], vf[1]);
        Mma(o[j + 1], pf, vf[2], vf[3]);
      }
    }
    __syncthreads();  // the stage, scores and probabilities are free again
    if (warp == 0 && i + kStages < n) IssueTile<C>(s, p, b, tile + kStages, stage, seq_len, lane);
  }

  // Epilogue: rows g and g + 8 of this warp's 128 dims.
  const float inv_lo = l_lo > 0.0f ? 1.0f / l_lo : 0.0f, inv_hi = l_hi > 0.0f ? 1.0f / l_hi : 0.0f;
  const float lse_lo = n > 0 ? m_lo + log2f(l_lo) : -INFINITY;
  const float lse_hi = n > 0 ? m_hi + log2f(l_hi) : -INFINITY;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int h = head0 + g + half * 8;
    if (h >= p.num_heads) continue;
    const float inv = half ? inv_hi : inv_lo;
    const float lse2 = half ? lse_hi : lse_lo;
    const int64_t bh = static_cast<int64_t>(b) * p.num_heads + h;
    if constexpr (kSplit) {
      float* part = SplitPartial(p, b, split, h);
#pragma unroll
      for (int j = 0; j < kVTiles; ++j) {
        *reinterpret_cast<float2*>(part + warp * kVSlice + j * 8 + 2 * tq) =
            make_float2(o[j][2 * half] * inv, o[j][2 * half + 1] * inv);
      }
      if (warp == 0 && tq == 0) *SplitLse(p, b, split, h) = lse2;
    } else {
      OutT* out = static_cast<OutT*>(p.out) + bh * kLatentDim + warp * kVSlice + 2 * tq;
#pragma unroll
      for (int j = 0; j < kVTiles; ++j) {
        const float x = o[j][2 * half] * inv, y = o[j][2 * half + 1] * inv;
        if constexpr (std::is_same_v<OutT, float>) {
          *reinterpret_cast<float2*>(out + j * 8) = make_float2(x, y);
        } else {
          *reinterpret_cast<__nv_bfloat162*>(out + j * 8) = __floats2bfloat162_rn(x, y);
        }
      }
      if (p.lse != nullptr && warp == 0 && tq == 0) p.lse[bh] = lse2 * 0.6931471805599453f;
    }
  }
}

// One CTA per (sequence, head): out = sum_s exp2(lse_s - lse) · O_s. Warp 0
// turns the split log-sum-exps into weights once; then kGroups thread groups
// of kLatentDim / 4 each stream their four dims of every kGroups-th split
// with the loads unrolled (batch 1 has a CTA a head: the groups put four
// times the loads in flight), and group 0 adds the others' sums.
template <typename OutT, int kGroups>
__global__ void __launch_bounds__(kLatentDim / 4 * kGroups) MlaCombineKernel(MlaDecodeParams p) {
  PdlBegin();
  static_assert(kMaxSplits <= 64, "warp 0 holds two splits per lane");
  __shared__ float weight[kMaxSplits];
  __shared__ float lse_total;
  const int b = blockIdx.x / p.num_heads, h = blockIdx.x % p.num_heads;
  const int num_splits = p.num_splits, lane = threadIdx.x & 31;
  const float* part = static_cast<const float*>(p.workspace);
  const float* lse_part =
      part + static_cast<int64_t>(p.batch) * num_splits * p.num_heads * kLatentDim;
  const int64_t row0 =
      static_cast<int64_t>(b) * num_splits * p.num_heads + h;  // split sp: row0 + sp * num_heads
  if (threadIdx.x < 32) {
    const float l0 =
        lane < num_splits ? lse_part[row0 + static_cast<int64_t>(lane) * p.num_heads] : -INFINITY;
    const float l1 = lane + 32 < num_splits
                         ? lse_part[row0 + static_cast<int64_t>(lane + 32) * p.num_heads]
                         : -INFINITY;
    const float mx = WarpMax(fmaxf(l0, l1));
    const float w0 = (mx == -INFINITY || l0 == -INFINITY) ? 0.0f : exp2f(l0 - mx);
    const float w1 = (mx == -INFINITY || l1 == -INFINITY) ? 0.0f : exp2f(l1 - mx);
    const float total = WarpSum(w0 + w1);
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    if (lane < num_splits) weight[lane] = w0 * inv;
    if (lane + 32 < num_splits) weight[lane + 32] = w1 * inv;
    if (lane == 0) lse_total = total > 0.0f ? mx + log2f(total) : -INFINITY;
  }
  __syncthreads();
  // Empty splits wrote zeros with weight 0: no branch needed.
  constexpr int kLanes = kLatentDim / 4;
  const int group = threadIdx.x / kLanes, col = threadIdx.x % kLanes;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  const float* src = part + row0 * kLatentDim + col * 4;
  const int64_t step = static_cast<int64_t>(p.num_heads) * kLatentDim;
#pragma unroll 8
  for (int sp = group; sp < num_splits; sp += kGroups) {
    const float w = weight[sp];
    const float4 v = *reinterpret_cast<const float4*>(src + sp * step);
    acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
  }
  if constexpr (kGroups > 1) {
    __shared__ float4 sums[kGroups - 1][kLanes];
    if (group > 0) sums[group - 1][col] = acc;
    __syncthreads();
    if (group > 0) return;
#pragma unroll
    for (int g = 0; g < kGroups - 1; ++g) {
      const float4 v = sums[g][col];
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
    }
  }
  const int64_t bh = static_cast<int64_t>(b) * p.num_heads + h;
  OutT* out = static_cast<OutT*>(p.out) + bh * kLatentDim + col * 4;
  if constexpr (std::is_same_v<OutT, float>) {
    *reinterpret_cast<float4*>(out) = acc;
  } else {
    *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(acc.x, acc.y);
    *reinterpret_cast<__nv_bfloat162*>(out + 2) = __floats2bfloat162_rn(acc.z, acc.w);
  }
  if (p.lse != nullptr && threadIdx.x == 0) p.lse[bh] = lse_total * 0.6931471805599453f;
}

template <typename C, bool kSplit, typename OutT>
absl::Status LaunchDecode(const MlaDecodeParams& p, dim3 grid) {
  constexpr auto kernel = MlaDecodeKernel<C, kSplit, OutT>;
  RETURN_IF_ERROR(AllowDynamicSmem<kernel>(static_cast<int>(sizeof(typename C::Smem))));
  return LaunchPdl("MlaDecodeKernel", kernel, grid, kThreads, sizeof(typename C::Smem), p.stream,
                   p);
}

// The configuration a launch with `num_heads` runs (kDefault resolved): the
// 64-head kernel from 64 heads up (mla_decode_wide.cu, over bf16 or FP8
// rows), else the 16-head tile of the rows' kind.
bool IsWide(MlaTileConfig t) { return t == MlaTileConfig::kHeads64Tokens64Stages2; }

MlaTileConfig Resolve(MlaTileConfig t, int num_heads, KvCacheDtype kv_dtype) {
  if (t != MlaTileConfig::kDefault) return t;
  if (num_heads >= kWideHeads) return MlaTileConfig::kHeads64Tokens64Stages2;
  return kv_dtype == KvCacheDtype::kFp8 ? kFp8DefaultTile : kDefaultTile;
}

// Calls f(Cfg<...>{}) for the 16-head tile configuration `t` names.
template <typename F>
auto WithTile(MlaTileConfig t, F&& f) {
  switch (t) {
    case MlaTileConfig::kTokens32Stages4:
      return f(Cfg<32, 4>{});
    case MlaTileConfig::kTokens32Stages5:
      return f(Cfg<32, 5>{});
    case MlaTileConfig::kTokens32Stages2:
      return f(Cfg<32, 2>{});
    case MlaTileConfig::kDefault:
    case MlaTileConfig::kTokens64Stages2:
    case MlaTileConfig::kHeads64Tokens64Stages2:
      break;
  }
  return f(Cfg<64, 2>{});
}

size_t WorkspaceBytes(int batch, int num_heads, int num_splits) {
  if (num_splits <= 1) return 0;
  return static_cast<size_t>(batch) * num_splits * num_heads * (kLatentDim + 1) * sizeof(float);
}

// The cost of a split CTA's partials (written, then read by the combine), in
// tile-times (see PlanMlaDecode); the same for both kernels.
constexpr double kSplitCost = 0.04;

MlaDecodePlan PlanFor(int batch, int num_heads, int max_seq_len, int num_sms, int heads_per_cta,
                      int tile_tokens, int ctas_per_sm, double split_cost) {
  MlaDecodePlan plan;
  const int64_t ctas = static_cast<int64_t>(std::max(batch, 1)) *
                       ((std::max(num_heads, 1) + heads_per_cta - 1) / heads_per_cta);
  const int max_tiles = std::max(1, (max_seq_len + tile_tokens - 1) / tile_tokens);
  const int64_t slots = static_cast<int64_t>(std::max(num_sms, 1)) * ctas_per_sm;
  // Makespan in tile-times: waves × (tiles per split + one tile of fixed cost
  // for the prologue, the epilogue and the combine), plus split_cost tile-times
  // for each CTA's split partials (written, then read by the combine).
  double best_cost = 0.0;
  for (int sp = 1; sp <= std::min(kMaxSplits, max_tiles); ++sp) {
    const int64_t waves = (ctas * sp + slots - 1) / slots;
    const double cost =
        static_cast<double>(waves * ((max_tiles + sp - 1) / sp + (sp > 1 ? 1 : 0))) +
        (sp > 1 ? split_cost * static_cast<double>(ctas * sp) : 0.0);
    if (sp == 1 || cost < best_cost) {
      best_cost = cost;
      plan.num_splits = sp;
    }
  }
  plan.workspace_bytes = WorkspaceBytes(batch, num_heads, plan.num_splits);
  return plan;
}

}  // namespace

size_t MlaDecodeWorkspaceBytes(int batch, int num_heads, int num_splits) {
  return WorkspaceBytes(batch, num_heads, num_splits);
}

MlaDecodePlan PlanMlaDecode(int batch, int num_heads, int max_seq_len, int num_sms,
                            MlaTileConfig tile, KvCacheDtype kv_dtype) {
  tile = Resolve(tile, num_heads, kv_dtype);
  if (IsWide(tile)) {
    // A 64-head CTA's partials are 64 × 513 floats (the 16-head kernel's a
    // quarter): at one tile-time ≈ 1.8 µs, each split CTA costs ~0.07 µs of
    // partials (kernel_bench --mla-wide-table's split rows, H100, 2026-12-06:
    // batch 1 × 4096 bf16 at 16 / 32 / 64 splits 23.0 / 20.7 / 23.9 µs).
    return PlanFor(batch, num_heads, max_seq_len, num_sms, kWideHeads, kKvBlockSize, 1, kSplitCost);
  }
  // The 16-head kernels: without the partials' cost the planner took the most
  // splits that fit a wave (kernel_bench --mla-table's split rows, H100,
  // 2026-12-06, bf16 rows 32x2: batch 1 × 2048 at 24 / 32 / 64 splits 12.5 /
  // 11.3 / 12.7 µs; batch 4 × 2048 at 16 / 24 / 32 / 64 14.4 / 13.3 / 13.8 /
  // 18.3; batch 4 × 8192 at 32 / 64 26.1 / 29.6; FP8 rows batch 1 × 2048 at
  // 16 / 32 10.5 / 10.3). With it: 32, 16, 32 and 32 splits.
  if (kv_dtype == KvCacheDtype::kFp8) {
    const Fp8TileShape shape = MlaFp8TileShape(tile);
    return PlanFor(batch, num_heads, max_seq_len, num_sms, kHeadsPerBlock, shape.tile_tokens,
                   shape.ctas_per_sm, kSplitCost);
  }
  return WithTile(tile, [&](auto cfg) {
    using C = decltype(cfg);
    return PlanFor(batch, num_heads, max_seq_len, num_sms, kHeadsPerBlock, C::kTileTokens,
                   C::kCtasPerSm, kSplitCost);
  });
}

absl::Status RunMlaDecode(const MlaDecodeParams& p) {
  if (p.kv_lora_rank != kLatentDim || p.rope_dim != kRopeDim) {
    return absl::InvalidArgumentError(absl::StrCat("RunMlaDecode: built for kv_lora_rank ",
                                                   kLatentDim, " and rope_dim ", kRopeDim));
  }
  const bool fp8 = p.kv_dtype == KvCacheDtype::kFp8;
  const int row_units =
      fp8 ? cpu::Fp8KvRowLayout{kLatentDim, kRopeDim}.bytes() / 2 : kLatentDim + kRopeDim;
  // Selected or strided rows: the 16-head bf16 kernel reads them row by row,
  // the 64-head kernel FP8 rows (its producer loads rows one by one anyway).
  const int stride = p.kv_row_stride != 0 ? p.kv_row_stride : row_units;
  const bool selected = p.kv_index != nullptr || stride != row_units;
  const MlaTileConfig tile = Resolve(p.tile, p.num_heads, p.kv_dtype);
  if (selected && (fp8 != IsWide(tile) || stride < row_units || stride % 8 != 0 ||
                   (p.kv_index != nullptr && p.kv_index_stride < p.max_seq_len))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunMlaDecode: selected (kv_index) or strided rows need bf16 rows and a 16-head tile "
        "(kTokens*), or FP8 rows and the 64-head tile (kHeads64Tokens64Stages2; the 16-head FP8 "
        "and 64-head bf16 kernels read dense blocks), a row stride of whole 16 bytes >= ",
        row_units, " units of 2 bytes (0: dense) and kv_index_stride >= max_seq_len"));
  }
  if (p.batch < 0 || p.num_heads <= 0 || p.num_blocks <= 0 || p.max_blocks_per_seq <= 0 ||
      p.max_seq_len < 0 ||
      p.max_seq_len > static_cast<int64_t>(p.max_blocks_per_seq) * kKvBlockSize) {
    return absl::InvalidArgumentError(
        "RunMlaDecode: need num_heads, num_blocks, max_blocks_per_seq > 0 and "
        "0 <= max_seq_len <= max_blocks_per_seq * 64");
  }
  if (p.num_splits < 1 || p.num_splits > kMaxSplits ||
      (p.num_splits > 1 &&
       (p.workspace == nullptr ||
        p.workspace_bytes < MlaDecodeWorkspaceBytes(p.batch, p.num_heads, p.num_splits)))) {
    return absl::InvalidArgumentError("RunMlaDecode: num_splits/workspace not from PlanMlaDecode");
  }
  if (p.batch == 0) return absl::OkStatus();
  if (!p.q || !p.kv_cache || !p.block_table || !p.seq_lens || !p.out) {
    return absl::InvalidArgumentError("RunMlaDecode: null pointer");
  }
  if ((reinterpret_cast<uintptr_t>(p.q) & 15) || (reinterpret_cast<uintptr_t>(p.kv_cache) & 15) ||
      (reinterpret_cast<uintptr_t>(p.out) & 15) ||
      (reinterpret_cast<uintptr_t>(p.workspace) & 15)) {
    return absl::InvalidArgumentError(
        "RunMlaDecode: q, kv_cache, out and workspace must be 16-byte aligned");
  }
  if (p.batch > 65535) return absl::InvalidArgumentError("RunMlaDecode: batch > 65535");
  const bool split = p.num_splits > 1;
  if (IsWide(tile)) {  // 64 heads a CTA, bf16 rows or FP8 rows widened in registers
    RETURN_IF_ERROR(LaunchMlaDecodeWide(p));
  } else if (fp8) {
    RETURN_IF_ERROR(LaunchMlaDecodeFp8(p, tile));
  } else {
    const dim3 grid(p.num_splits, (p.num_heads + kHeadsPerBlock - 1) / kHeadsPerBlock, p.batch);
    MlaDecodeParams q = p;  // the kernel reads the row stride (dense: kHeadDim)
    if (q.kv_row_stride == 0) q.kv_row_stride = kHeadDim;
    const auto launch = [&](auto cfg) {
      using C = decltype(cfg);
      if (q.out_type == OutType::kFloat32) {
        return split ? LaunchDecode<C, true, float>(q, grid)
                     : LaunchDecode<C, false, float>(q, grid);
      }
      return split ? LaunchDecode<C, true, bf16>(q, grid) : LaunchDecode<C, false, bf16>(q, grid);
    };
    RETURN_IF_ERROR(WithTile(tile, launch));
  }
  if (!split) return absl::OkStatus();
  // Four groups over the splits (H100, V2-Lite FP8 batch 1: the combine 9.8 -> 6.0 us under ncu).
  constexpr int kGroups = 4;
  const auto combine = [&](auto kernel) {
    return LaunchPdl("MlaCombineKernel", kernel, p.batch * p.num_heads, kLatentDim / 4 * kGroups, 0,
                     p.stream, p);
  };
  return p.out_type == OutType::kFloat32 ? combine(MlaCombineKernel<float, kGroups>)
                                         : combine(MlaCombineKernel<bf16, kGroups>);
}

}  // namespace moesh::cuda
