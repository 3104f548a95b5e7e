// MLA decode with 64 heads per CTA, two kernels: the one-scorer kernel
// (MlaTileConfig::kHeads64Tokens64Stages2, described here) and the seesaw
// kernel (kHeads64Seesaw, its own comment below), for the wide-head models (V2/V3/V3.2: 128 heads):
// each cache byte a CTA streams serves 64 heads, so a sequence's KV crosses L2 num_heads / 64 times
// instead of num_heads / 16 (BENCHMARKS.md: the 16-head kernel moved 5.8 GB
// through L2 for 1.0 GB of cache at 128 heads).
//
// One CTA = (KV split, group of 64 heads, sequence); Q [64 heads, 576] sits in
// shared memory (SW128 column blocks, wgmma.cuh) for the whole CTA. Warp-
// specialized, FlashMLA's division of labour:
//   * producer (warpgroup 2, one lane): streams the split's cache blocks (64 tokens
//     = one tile) into a two-stage ring, nine 2-D tensor copies per tile (a
//     64 x 64 box per column block, swizzled by the copy engine), completing
//     on full[stage]; it reuses a stage once all eight consumer warps have
//     arrived on empty[stage];
//   * warpgroup 0: S = Q · K^T over all 576 dims (36 wgmma m64n64k16), the
//     online softmax in fp32 (base 2; a row's 64 scores live in one quad),
//     P to shared memory as bf16 with the rescale factors, then
//     O[:, 0:256) += P · V with P from registers (m64n256k16, A in registers);
//   * warpgroup 1: O[:, 256:512) += P · V with P from shared memory, while
//     warpgroup 0 already scores the next tile.
// Named barriers hand P over: kPFull (warpgroup 0 arrives, 1 syncs) and
// kPFree (1 arrives once its product is done, 0 syncs before the next P).
// Splits write (O / l, log2-sum-exp) partials for mla_decode.cu's combine.
#include <cuda.h>

#include <vector>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/mla_decode_common.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace moesh::cuda::mla {
namespace {

constexpr int kTile = kKvBlockSize;                   // tokens per tile: one cache block
constexpr int kStages = 2;                            // tiles in flight
constexpr int kColBlocks = kHeadDim / 64;             // 9 SW128 column blocks of a row
constexpr int kBlockBytes = kTile * 128;              // one column block of 64 rows: 8 KB
constexpr int kTileBytes = kColBlocks * kBlockBytes;  // 72 KB: Q, or one KV tile
constexpr int kOutDims = kLatentDim / 2;              // latent dims a warpgroup owns
constexpr int kSRegs = kTile / 2;                     // m64n64 accumulators per thread
constexpr int kORegs = kOutDims / 2;                  // m64n256 accumulators per thread
constexpr int kThreads = kWideThreads + 128;          // two consumer warpgroups + the producer's
// Registers per thread after setmaxnreg. A CTA of 384 threads gets 168 each
// at launch (65536 / 384, in steps of 8); setmaxnreg only moves registers
// within the CTA, so 2 x 240 + 24 per warpgroup lane is all there is.
constexpr int kConsumerRegs = 240, kProducerRegs = 24;
static_assert((2 * kConsumerRegs + kProducerRegs) * 128 <= 65536 / kThreads / 8 * 8 * kThreads,
              "setmaxnreg would wait forever for registers the CTA does not have");
constexpr int kConsumerWarps = kWideThreads / 32;
// Named barriers (0 is __syncthreads).
constexpr int kPFull = 1, kPFree = 2, kStats = 3, kWg0 = 4;
static_assert(kWideHeads == 64 && kWideThreads == 256 && kHeadDim % 64 == 0);

struct Smem {
  uint8_t q[kTileBytes];               // [64 heads, 576], SW128 column blocks
  uint8_t kv[kStages][kTileBytes];     // [64 tokens, 576] per stage
  uint8_t p[kBlockBytes];              // [64 heads, 64 tokens] bf16 probabilities
  float alpha[kWideHeads];             // per head: the rescale of O that goes with p
  float m[kWideHeads], l[kWideHeads];  // per head, after the last tile (log2 units)
  alignas(8) uint64_t full[kStages], empty[kStages];
};
// 1 KB of slack to align the dynamic shared memory to 1024 bytes (SW128).
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem)) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "over Hopper's shared memory per CTA");

// Named barriers, the non-.aligned forms (a warp may reach them diverged).
// The hand-offs are one-sided: making warpgroup 0 also wait at kPFull cost
// 20% (287 -> 357 us at 128 x 4096). compute-sanitizer's racecheck reports
// hazards on the plain shared-memory traffic these barriers order (alpha; and
// m, l even behind the two-sided kStats), with two-sided syncs as well, so
// tools/device/tests.sh runs racecheck on the 16-head kernel only.
__device__ __forceinline__ void BarSync(int id, int threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void BarArrive(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Rows [valid, 64) of a tile past the sequence's end become zeros (their
// probabilities are 0, and 0 · NaN of whatever the pool holds there would
// poison O). A row is 128 contiguous bytes in each column block.
__device__ __forceinline__ void ZeroRows(uint8_t* tile, int valid, int t, int threads) {
  const int chunks = (kTile - valid) * kColBlocks * 8;  // 16-byte chunks
  for (int i = t; i < chunks; i += threads) {
    const int row = valid + i / (kColBlocks * 8), rest = i % (kColBlocks * 8);
    *reinterpret_cast<uint4*>(tile + (rest / 8) * kBlockBytes + row * 128 + (rest % 8) * 16) =
        make_uint4(0, 0, 0, 0);
  }
}

// The epilogue of one warpgroup: rows lo/hi of its 256 dims, normalized.
// Q rows [head0, head0 + 64) of sequence b (zeros past num_heads) into SW128
// column blocks at `q`, by the CTA's kThreads threads; the caller syncs.
__device__ __forceinline__ void LoadQ(uint8_t* q, const MlaDecodeParams& p, int b, int head0,
                                      int tid) {
  for (int i = tid; i < kWideHeads * kColBlocks * 8; i += kThreads) {
    const int row = i / (kColBlocks * 8), chunk = i % (kColBlocks * 8), h = head0 + row;
    const uint4 v = h < p.num_heads
                        ? reinterpret_cast<const uint4*>(
                              p.q + (static_cast<int64_t>(b) * p.num_heads + h) * kHeadDim)[chunk]
                        : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(q + (chunk / 8) * kBlockBytes +
                              wgmma::Swizzle128Offset(row, (chunk % 8) * 8)) = v;
  }
  wgmma::FenceProxyAsync();
}

// m and l: the final maxima and sums of rows row_lo and row_lo + 8.
template <bool kSplit, typename OutT>
__device__ __forceinline__ void WriteOut(const MlaDecodeParams& p, const float (&o)[kORegs], int b,
                                         int split, int head0, int wg, int row_lo, int tq,
                                         const float (&m_rows)[2], const float (&l_rows)[2],
                                         int n) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_lo + half * 8, h = head0 + row;
    if (h >= p.num_heads) continue;
    const float l = l_rows[half], m = m_rows[half];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const float lse2 = n > 0 ? m + log2f(l) : -INFINITY;
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

template <bool kSplit, typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    MlaDecodeWideKernel(const __grid_constant__ CUtensorMap map, MlaDecodeParams p) {
  extern __shared__ uint8_t smem_raw[];
  Smem& s =
      *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int split = blockIdx.x, head0 = blockIdx.y * kWideHeads, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int seq_len = p.seq_lens[b];
  const int n_tiles = (seq_len + kTile - 1) / kTile;
  const SplitRange range = SplitTiles(n_tiles, split, p.num_splits);
  const int n = range.end - range.begin;

  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) {
      MbarInit(&s.full[st], 1);
      MbarInit(&s.empty[st], kConsumerWarps);
    }
    FenceMbarInit();
  }
  LoadQ(s.q, p, b, head0, tid);
  __syncthreads();

  if (warp >= kConsumerWarps) {  // the producer warpgroup: one lane works
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if (warp == kConsumerWarps && lane == 0) {
      for (int i = 0; i < n; ++i) {
        const int stage = i % kStages;
        if (i >= kStages) MbarWait(&s.empty[stage], (i / kStages - 1) & 1);
        const int block =
            p.block_table[static_cast<int64_t>(b) * p.max_blocks_per_seq + range.begin + i];
        MbarArriveExpectTx(&s.full[stage], kTileBytes);
#pragma unroll
        for (int c = 0; c < kColBlocks; ++c) {
          TmaLoad2D(&s.kv[stage][c * kBlockBytes], &map, c * 64, block * kKvBlockSize,
                    &s.full[stage]);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int wg = tid / 128, t = tid % 128;
  const int g = lane / 4, tq = lane % 4;                        // accumulator row group / quad lane
  const int row_lo = (warp % 4) * 16 + g, row_hi = row_lo + 8;  // this thread's two heads
  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;

  if (wg == 0) {
    const float scale_log2 = p.softmax_scale * kLog2e;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int stage = i % kStages, tile = range.begin + i;
      uint8_t* kv = s.kv[stage];
      MbarWait(&s.full[stage], (i / kStages) & 1);
      __syncwarp();  // the wgmma below are warp-synchronous
      const int valid = min(kTile, seq_len - tile * kTile);
      if (valid < kTile) {  // the sequence's last tile
        ZeroRows(kv, valid, t, 128);
        wgmma::FenceProxyAsync();
        BarSync(kWg0, 128);
      }
      // S[64 heads, 64 tokens] over the 576 dims.
      float sc[kSRegs];
      wgmma::GemmM64N64KMajor<kColBlocks>(sc, s.q, kv, kBlockBytes);

      // Scale, mask past the end; a row's 64 scores are in this quad.
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
      // Every tile holds a token of the sequence, so the maxima are finite.
      const float alpha_lo = exp2f(m_lo - mx_lo), alpha_hi = exp2f(m_hi - mx_hi);
      m_lo = mx_lo;
      m_hi = mx_hi;
      // P as bf16 A fragments: k step kk covers n-tiles 2kk and 2kk + 1.
      uint32_t pa[kTile / 16][4];
      float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
      for (int j = 0; j < kSRegs / 4; ++j) {
        const uint32_t plo = PackBf16(exp2f(sc[4 * j + 0] - m_lo), exp2f(sc[4 * j + 1] - m_lo));
        const uint32_t phi = PackBf16(exp2f(sc[4 * j + 2] - m_hi), exp2f(sc[4 * j + 3] - m_hi));
        pa[j / 2][(j % 2) * 2 + 0] = plo;
        pa[j / 2][(j % 2) * 2 + 1] = phi;
        // Sum what P·V will use: the rounded probabilities.
        const float2 x = UnpackBf16(plo), y = UnpackBf16(phi);
        sum_lo += x.x + x.y;
        sum_hi += y.x + y.y;
      }
      l_lo = l_lo * alpha_lo + sum_lo;  // this thread's columns; the quad sums at the end
      l_hi = l_hi * alpha_hi + sum_hi;
#pragma unroll
      for (int j = 0; j < kORegs / 4; ++j) {
        o[4 * j + 0] *= alpha_lo, o[4 * j + 1] *= alpha_lo;
        o[4 * j + 2] *= alpha_hi, o[4 * j + 3] *= alpha_hi;
      }
      // Hand P and alpha to warpgroup 1 once it is done with the last ones.
      if (i > 0) BarSync(kPFree, kWideThreads);
#pragma unroll
      for (int j = 0; j < kSRegs / 4; ++j) {
        const int col = j * 8 + 2 * tq;
        *reinterpret_cast<uint32_t*>(s.p + wgmma::Swizzle128Offset(row_lo, col)) =
            pa[j / 2][(j % 2) * 2 + 0];
        *reinterpret_cast<uint32_t*>(s.p + wgmma::Swizzle128Offset(row_hi, col)) =
            pa[j / 2][(j % 2) * 2 + 1];
      }
      if (tq == 0) s.alpha[row_lo] = alpha_lo, s.alpha[row_hi] = alpha_hi;
      wgmma::FenceProxyAsync();
      __syncwarp();
      BarArrive(kPFull, kWideThreads);

      // O[:, 0:256) += P · V[:, 0:256).
      wgmma::FenceOperands(o);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wgmma::WgmmaM64N256K16Rs<1>(o, pa[kk], wgmma::DescMnMajor(kv + kk * 16 * 128, kBlockBytes),
                                    1);
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceOperands(o);
      __syncwarp();
      if (lane == 0) MbarArrive(&s.empty[stage]);
    }
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
      l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
    }
    if (tq == 0) {
      s.m[row_lo] = m_lo, s.m[row_hi] = m_hi;
      s.l[row_lo] = l_lo, s.l[row_hi] = l_hi;
    }
    BarSync(kStats, kWideThreads);
  } else {
    for (int i = 0; i < n; ++i) {
      const int stage = i % kStages;
      const uint8_t* kv = s.kv[stage];
      MbarWait(&s.full[stage], (i / kStages) & 1);
      BarSync(kPFull, kWideThreads);
      __syncwarp();
      const float alpha_lo = s.alpha[row_lo], alpha_hi = s.alpha[row_hi];
#pragma unroll
      for (int j = 0; j < kORegs / 4; ++j) {
        o[4 * j + 0] *= alpha_lo, o[4 * j + 1] *= alpha_lo;
        o[4 * j + 2] *= alpha_hi, o[4 * j + 3] *= alpha_hi;
      }
      // O[:, 256:512) += P · V[:, 256:512).
      wgmma::FenceOperands(o);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wgmma::WgmmaM64N256K16<1>(
            o, wgmma::DescKMajor(s.p + kk * 32),
            wgmma::DescMnMajor(kv + (kOutDims / 64) * kBlockBytes + kk * 16 * 128, kBlockBytes), 1);
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceOperands(o);
      if (i + 1 < n) BarArrive(kPFree, kWideThreads);
      __syncwarp();
      if (lane == 0) MbarArrive(&s.empty[stage]);
    }
    BarSync(kStats, kWideThreads);
  }
  const float m_rows[2] = {s.m[row_lo], s.m[row_hi]}, l_rows[2] = {s.l[row_lo], s.l[row_hi]};
  WriteOut<kSplit, OutT>(p, o, b, split, head0, wg, row_lo, tq, m_rows, l_rows, n);
}

// ---- The seesaw kernel (MlaTileConfig::kHeads64Seesaw) ----
// FlashMLA's division of a pair of tiles between the two consumer warpgroups:
// tile a = 2j of the split sits in stage 0, tile b = 2j + 1 in stage 1.
// Warpgroup 0 owns O[:, 0:256) and scores a; warpgroup 1 owns O[:, 256:512)
// and scores b, both at once. Then, per pair:
//   wg 0: m_a = max(m, rowmax S_a), P_a; publishes P_a (into a's rope block,
//         free once a is scored) and m_a (kAReady); O_L = O_L · 2^(m - m_a)
//         + P_a V_a,L (P from registers); waits for P_b and m_b (kBReady);
//         O_L = O_L · 2^(m_a - m_b) + P_b V_b,L (P from shared memory);
//   wg 1: waits for m_a and P_a; O_R = O_R · 2^(m - m_a) + P_a V_a,R while it
//         turns S_b into m_b = max(m_a, rowmax S_b) and P_b and publishes them;
//         O_R = O_R · 2^(m_a - m_b) + P_b V_b,R.
// Each warpgroup issues half of the tensor work (one S, two half products), so
// neither waits on the other's serial chain as the one-scorer kernel above
// does (its warpgroup 0 issues S and half of P · V, 1 only the other half).
// Each warpgroup keeps the sum of its own tiles' probabilities on the shared
// running maximum; the two sums add up at the end. The producer loads a
// tile's column blocks 0-3 (V's first half: warpgroup 0's) and 4-8 (V's
// second half and the rope keys, where P goes) on barriers of their own, so
// blocks 0-3 of the next tile stream in while warpgroup 1 still reads 4-8.
namespace seesaw {

constexpr int kLoBlocks = kOutDims / 64;  // 4: V's first half; 4-8 the second and the rope keys
constexpr int kPBlock = kColBlocks - 1;   // a scored tile's rope block holds its P
constexpr int kAReady = 1, kBReady = 2, kStats = 3, kWgBar = 4;  // kWgBar + wg: one warpgroup

struct Smem {
  uint8_t q[kTileBytes];                        // [64 heads, 576], SW128 column blocks
  uint8_t kv[2][kTileBytes];                    // tiles a and b
  float m_a[kWideHeads], m_b[kWideHeads];       // a pair's maxima, published by their scorer
  float l[2][kWideHeads];                       // per warpgroup, after the last pair
  alignas(8) uint64_t full[2][2], empty[2][2];  // [stage][blocks 0-3, blocks 4-8]
};
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem)) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "over Hopper's shared memory per CTA");
// Arrivals that free a stage's halves: blocks 0-3 are last read by warpgroup 0
// (S_a and V_a,L; V_b,L after warpgroup 1 scored b); blocks 4-8 of a by
// warpgroup 1 (V_a,R and P_a, after warpgroup 0 scored a), of b by both (V_b,R;
// P_b read by warpgroup 0).
__device__ __forceinline__ int EmptyCount(int stage, int half) {
  return stage == 1 && half == 1 ? 8 : 4;
}

// S = Q · K^T over the tile's nine column blocks at `kv`: blocks 0-3 once
// `full_lo` completes phase `parity`, 4-8 once `full_hi` does. A tile holding
// `valid` < 64 tokens (the sequence's last) has its rows past them zeroed
// first (their probabilities are 0, and 0 · NaN of whatever the pool holds
// would poison O); t: the thread in warpgroup wg.
__device__ __forceinline__ void ScoreTile(float (&sc)[kSRegs], const uint8_t* q, uint8_t* kv,
                                          uint64_t* full_lo, uint64_t* full_hi, uint32_t parity,
                                          int valid, int t, int wg) {
  MbarWait(full_lo, parity);
  if (valid < kTile) {
    MbarWait(full_hi, parity);
    __syncwarp();
    ZeroRows(kv, valid, t, 128);
    wgmma::FenceProxyAsync();
    BarSync(kWgBar + wg, 128);
  }
  __syncwarp();  // the wgmma below are warp-synchronous
#pragma unroll
  for (int r = 0; r < kSRegs; ++r) sc[r] = 0.0f;
  wgmma::FenceOperands(sc);
  wgmma::Fence();
#pragma unroll
  for (int c = 0; c < kLoBlocks; ++c) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma::WgmmaM64N64K16<0>(sc, wgmma::DescKMajor(q + c * kBlockBytes + kk * 32),
                               wgmma::DescKMajor(kv + c * kBlockBytes + kk * 32), 1);
    }
  }
  // Committed before the wait: ptxas serializes every wgmma of a kernel
  // whose accumulators are in flight across a divergent loop (C7520).
  wgmma::Commit();
  if (valid == kTile) {
    MbarWait(full_hi, parity);
    __syncwarp();
  }
  wgmma::Fence();
#pragma unroll
  for (int c = kLoBlocks; c < kColBlocks; ++c) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      wgmma::WgmmaM64N64K16<0>(sc, wgmma::DescKMajor(q + c * kBlockBytes + kk * 32),
                               wgmma::DescKMajor(kv + c * kBlockBytes + kk * 32), 1);
    }
  }
  wgmma::Commit();
  wgmma::Wait<0>();
  wgmma::FenceOperands(sc);
}

// A tile's scores to probabilities (log2 units): scaled, masked past
// seq_len, the maxima m_lo / m_hi (in: the running ones; out: raised to this
// tile's), P as bf16 A fragments (k step kk covers n-tiles 2kk and 2kk + 1)
// and this thread's share of the rounded probabilities' row sums.
__device__ __forceinline__ void TileProbabilities(float (&sc)[kSRegs], int tile, int seq_len,
                                                  float scale_log2, int tq, float& m_lo,
                                                  float& m_hi, uint32_t (&pa)[kTile / 16][4],
                                                  float& sum_lo, float& sum_hi) {
#pragma unroll
  for (int j = 0; j < kSRegs / 4; ++j) {
    const int tok = tile * kTile + j * 8 + 2 * tq;
    const bool ok0 = tok < seq_len, ok1 = tok + 1 < seq_len;
    sc[4 * j + 0] = ok0 ? sc[4 * j + 0] * scale_log2 : -INFINITY;
    sc[4 * j + 1] = ok1 ? sc[4 * j + 1] * scale_log2 : -INFINITY;
    sc[4 * j + 2] = ok0 ? sc[4 * j + 2] * scale_log2 : -INFINITY;
    sc[4 * j + 3] = ok1 ? sc[4 * j + 3] * scale_log2 : -INFINITY;
    m_lo = fmaxf(m_lo, fmaxf(sc[4 * j + 0], sc[4 * j + 1]));
    m_hi = fmaxf(m_hi, fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    m_lo = fmaxf(m_lo, __shfl_xor_sync(0xffffffffu, m_lo, off));
    m_hi = fmaxf(m_hi, __shfl_xor_sync(0xffffffffu, m_hi, off));
  }
  // Every tile holds a token of the sequence, so the maxima are finite.
  sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
  for (int j = 0; j < kSRegs / 4; ++j) {
    const uint32_t plo = PackBf16(exp2f(sc[4 * j + 0] - m_lo), exp2f(sc[4 * j + 1] - m_lo));
    const uint32_t phi = PackBf16(exp2f(sc[4 * j + 2] - m_hi), exp2f(sc[4 * j + 3] - m_hi));
    pa[j / 2][(j % 2) * 2 + 0] = plo;
    pa[j / 2][(j % 2) * 2 + 1] = phi;
    const float2 x = UnpackBf16(plo), y = UnpackBf16(phi);  // what P · V uses
    sum_lo += x.x + x.y;
    sum_hi += y.x + y.y;
  }
}

// P (this thread's fragments) into the SW128 block `pblock` [64 heads, 64
// tokens], readable by the other warpgroup's wgmma after a named barrier.
__device__ __forceinline__ void StoreP(uint8_t* pblock, const uint32_t (&pa)[kTile / 16][4],
                                       int row_lo, int row_hi, int tq) {
#pragma unroll
  for (int j = 0; j < kSRegs / 4; ++j) {
    const int col = j * 8 + 2 * tq;
    *reinterpret_cast<uint32_t*>(pblock + wgmma::Swizzle128Offset(row_lo, col)) =
        pa[j / 2][(j % 2) * 2 + 0];
    *reinterpret_cast<uint32_t*>(pblock + wgmma::Swizzle128Offset(row_hi, col)) =
        pa[j / 2][(j % 2) * 2 + 1];
  }
  wgmma::FenceProxyAsync();
}

__device__ __forceinline__ void Rescale(float (&o)[kORegs], float lo, float hi) {
#pragma unroll
  for (int j = 0; j < kORegs / 4; ++j) {
    o[4 * j + 0] *= lo, o[4 * j + 1] *= lo;
    o[4 * j + 2] *= hi, o[4 * j + 3] *= hi;
  }
}

// O (+)= P · V over one tile's 64 tokens, V = the 256 dims at `v` (four SW128
// column blocks), P from registers (issued, not waited for).
__device__ __forceinline__ void IssuePvRegs(float (&o)[kORegs], const uint32_t (&pa)[kTile / 16][4],
                                            const uint8_t* v) {
  wgmma::FenceOperands(o);
  wgmma::Fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    wgmma::WgmmaM64N256K16Rs<1>(o, pa[kk], wgmma::DescMnMajor(v + kk * 16 * 128, kBlockBytes), 1);
  }
  wgmma::Commit();
}
// The same with P from the SW128 block `pblock`.
__device__ __forceinline__ void IssuePvSmem(float (&o)[kORegs], const uint8_t* pblock,
                                            const uint8_t* v) {
  wgmma::FenceOperands(o);
  wgmma::Fence();
#pragma unroll
  for (int kk = 0; kk < kTile / 16; ++kk) {
    wgmma::WgmmaM64N256K16<1>(o, wgmma::DescKMajor(pblock + kk * 32),
                              wgmma::DescMnMajor(v + kk * 16 * 128, kBlockBytes), 1);
  }
  wgmma::Commit();
}
__device__ __forceinline__ void WaitPv(float (&o)[kORegs]) {
  wgmma::Wait<0>();
  wgmma::FenceOperands(o);
}

template <bool kSplit, typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    MlaDecodeSeesawKernel(const __grid_constant__ CUtensorMap map, MlaDecodeParams p) {
  extern __shared__ uint8_t smem_raw[];
  Smem& s =
      *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int split = blockIdx.x, head0 = blockIdx.y * kWideHeads, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int seq_len = p.seq_lens[b];
  const int n_tiles = (seq_len + kTile - 1) / kTile;
  const SplitRange range = SplitTiles(n_tiles, split, p.num_splits);
  const int n = range.end - range.begin;

  if (tid == 0) {
    for (int st = 0; st < 2; ++st) {
      for (int half = 0; half < 2; ++half) {
        MbarInit(&s.full[st][half], 1);
        MbarInit(&s.empty[st][half], EmptyCount(st, half));
      }
    }
    FenceMbarInit();
  }
  LoadQ(s.q, p, b, head0, tid);
  __syncthreads();

  if (warp >= kConsumerWarps) {  // the producer warpgroup: one lane works
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if (warp == kConsumerWarps && lane == 0) {
      for (int i = 0; i < n; ++i) {
        const int st = i % 2, j = i / 2;
        const int block =
            p.block_table[static_cast<int64_t>(b) * p.max_blocks_per_seq + range.begin + i];
        for (int half = 0; half < 2; ++half) {
          const int c0 = half == 0 ? 0 : kLoBlocks, c1 = half == 0 ? kLoBlocks : kColBlocks;
          if (j > 0) MbarWait(&s.empty[st][half], (j - 1) & 1);
          MbarArriveExpectTx(&s.full[st][half], (c1 - c0) * kBlockBytes);
          for (int c = c0; c < c1; ++c) {
            TmaLoad2D(&s.kv[st][c * kBlockBytes], &map, c * 64, block * kKvBlockSize,
                      &s.full[st][half]);
          }
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int wg = tid / 128, t = tid % 128;
  const int g = lane / 4, tq = lane % 4;                        // accumulator row group / quad lane
  const int row_lo = (warp % 4) * 16 + g, row_hi = row_lo + 8;  // this thread's two heads
  const float scale_log2 = p.softmax_scale * kLog2e;
  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
  // The running maxima (shared by both warpgroups) and this warpgroup's sums.
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
  uint8_t* const kva = s.kv[0];
  uint8_t* const kvb = s.kv[1];
  const int pairs = (n + 1) / 2;
  for (int j = 0; j < pairs; ++j) {
    const uint32_t parity = j & 1;
    const int tile_a = range.begin + 2 * j, tile_b = tile_a + 1;
    const bool has_b = 2 * j + 1 < n;
    float sc[kSRegs];
    uint32_t pr[kTile / 16][4];  // this warpgroup's tile's P
    if (wg == 0) {
      ScoreTile(sc, s.q, kva, &s.full[0][0], &s.full[0][1], parity,
                min(kTile, seq_len - tile_a * kTile), t, 0);
      float ma_lo = m_lo, ma_hi = m_hi, sum_lo, sum_hi;
      TileProbabilities(sc, tile_a, seq_len, scale_log2, tq, ma_lo, ma_hi, pr, sum_lo, sum_hi);
      StoreP(kva + kPBlock * kBlockBytes, pr, row_lo, row_hi, tq);
      if (tq == 0) s.m_a[row_lo] = ma_lo, s.m_a[row_hi] = ma_hi;
      __syncwarp();
      BarArrive(kAReady, kWideThreads);
      const float sa_lo = exp2f(m_lo - ma_lo), sa_hi = exp2f(m_hi - ma_hi);
      m_lo = ma_lo, m_hi = ma_hi;
      l_lo = l_lo * sa_lo + sum_lo, l_hi = l_hi * sa_hi + sum_hi;
      Rescale(o, sa_lo, sa_hi);
      IssuePvRegs(o, pr, kva);  // O_L += P_a · V_a[:, 0:256)
      WaitPv(o);
      __syncwarp();
      if (lane == 0) MbarArrive(&s.empty[0][0]);  // the next a's blocks 0-3 may load
      if (has_b) {
        BarSync(kBReady, kWideThreads);
        // V_b[:, 0:256) landed (warpgroup 1 waited; this wait only shows it here).
        MbarWait(&s.full[1][0], parity);
        MbarWait(&s.full[1][1], parity);
        __syncwarp();
        const float mb_lo = s.m_b[row_lo], mb_hi = s.m_b[row_hi];
        const float sb_lo = exp2f(m_lo - mb_lo), sb_hi = exp2f(m_hi - mb_hi);
        m_lo = mb_lo, m_hi = mb_hi;
        l_lo *= sb_lo, l_hi *= sb_hi;
        Rescale(o, sb_lo, sb_hi);
        IssuePvSmem(o, kvb + kPBlock * kBlockBytes, kvb);  // O_L += P_b · V_b[:, 0:256)
        WaitPv(o);
        __syncwarp();
        if (lane == 0) MbarArrive(&s.empty[1][0]), MbarArrive(&s.empty[1][1]);
      }
    } else {
      if (has_b) {
        ScoreTile(sc, s.q, kvb, &s.full[1][0], &s.full[1][1], parity,
                  min(kTile, seq_len - tile_b * kTile), t, 1);
      }
      BarSync(kAReady, kWideThreads);
      MbarWait(&s.full[0][1], parity);  // V_a[:, 256:512) landed (shown here too)
      __syncwarp();
      const float ma_lo = s.m_a[row_lo], ma_hi = s.m_a[row_hi];
      const float sa_lo = exp2f(m_lo - ma_lo), sa_hi = exp2f(m_hi - ma_hi);
      m_lo = ma_lo, m_hi = ma_hi;
      l_lo *= sa_lo, l_hi *= sa_hi;
      Rescale(o, sa_lo, sa_hi);
      // O_R += P_a · V_a[:, 256:512), while this warpgroup turns S_b into P_b.
      IssuePvSmem(o, kva + kPBlock * kBlockBytes, kva + kLoBlocks * kBlockBytes);
      if (has_b) {
        float mb_lo = m_lo, mb_hi = m_hi, sum_lo, sum_hi;
        TileProbabilities(sc, tile_b, seq_len, scale_log2, tq, mb_lo, mb_hi, pr, sum_lo, sum_hi);
        StoreP(kvb + kPBlock * kBlockBytes, pr, row_lo, row_hi, tq);
        if (tq == 0) s.m_b[row_lo] = mb_lo, s.m_b[row_hi] = mb_hi;
        __syncwarp();
        BarArrive(kBReady, kWideThreads);
        const float sb_lo = exp2f(m_lo - mb_lo), sb_hi = exp2f(m_hi - mb_hi);
        m_lo = mb_lo, m_hi = mb_hi;
        l_lo = l_lo * sb_lo + sum_lo, l_hi = l_hi * sb_hi + sum_hi;
        WaitPv(o);
        __syncwarp();
        if (lane == 0) MbarArrive(&s.empty[0][1]);
        Rescale(o, sb_lo, sb_hi);
        IssuePvRegs(o, pr, kvb + kLoBlocks * kBlockBytes);  // O_R += P_b · V_b[:, 256:512)
        WaitPv(o);
        __syncwarp();
        if (lane == 0) MbarArrive(&s.empty[1][1]);
      } else {
        WaitPv(o);
        __syncwarp();
        if (lane == 0) MbarArrive(&s.empty[0][1]);
      }
    }
  }
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  if (tq == 0) s.l[wg][row_lo] = l_lo, s.l[wg][row_hi] = l_hi;
  BarSync(kStats, kWideThreads);
  // Both warpgroups hold the same maxima; the sums add up.
  const float m_rows[2] = {m_lo, m_hi};
  const float l_rows[2] = {s.l[0][row_lo] + s.l[1][row_lo], s.l[0][row_hi] + s.l[1][row_hi]};
  WriteOut<kSplit, OutT>(p, o, b, split, head0, wg, row_lo, tq, m_rows, l_rows, n);
}

}  // namespace seesaw

// The paged cache as a 2-D tensor [num_blocks * 64 rows, 576] of bf16, read
// in 64 x 64 boxes swizzled for SW128.
absl::StatusOr<CUtensorMap> CacheMap(const MlaDecodeParams& p) {
  return Bf16BoxMap64(p.kv_cache, static_cast<uint64_t>(p.num_blocks) * kKvBlockSize, kHeadDim,
                      kHeadDim, "the KV cache");
}

template <bool kSplit, typename OutT>
absl::Status Launch(const CUtensorMap& map, const MlaDecodeParams& p, bool pairs) {
  const dim3 grid(p.num_splits, (p.num_heads + kWideHeads - 1) / kWideHeads, p.batch);
  if (pairs) {
    constexpr auto kernel = seesaw::MlaDecodeSeesawKernel<kSplit, OutT>;
    RETURN_IF_ERROR(AllowDynamicSmem<kernel>(seesaw::kSmemBytes));
    kernel<<<grid, kThreads, seesaw::kSmemBytes, p.stream>>>(map, p);
    return LaunchStatus("MlaDecodeSeesawKernel");
  }
  constexpr auto kernel = MlaDecodeWideKernel<kSplit, OutT>;
  RETURN_IF_ERROR(AllowDynamicSmem<kernel>(kSmemBytes));
  kernel<<<grid, kThreads, kSmemBytes, p.stream>>>(map, p);
  return LaunchStatus("MlaDecodeWideKernel");
}

// CacheMap(p), encoded once per (cache pointer, block count) and thread: a
// map depends on nothing else, so one made for memory since freed and
// reallocated at the same address with the same size is still right.
absl::StatusOr<CUtensorMap> CachedCacheMap(const MlaDecodeParams& p) {
  struct Entry {
    const void* cache;
    int num_blocks;
    CUtensorMap map;
  };
  thread_local std::vector<Entry> maps;  // few: one per pool (or layer) a thread runs
  for (const Entry& e : maps) {
    if (e.cache == p.kv_cache && e.num_blocks == p.num_blocks) return e.map;
  }
  ASSIGN_OR_RETURN(const CUtensorMap map, CacheMap(p));
  if (maps.size() >= 256) maps.clear();  // bounded
  maps.push_back({p.kv_cache, p.num_blocks, map});
  return map;
}

}  // namespace

absl::Status LaunchMlaDecodeWide(const MlaDecodeParams& p, MlaTileConfig tile) {
  ASSIGN_OR_RETURN(const CUtensorMap map, CachedCacheMap(p));
  const bool split = p.num_splits > 1, pairs = tile == MlaTileConfig::kHeads64Seesaw;
  if (p.out_type == OutType::kFloat32) {
    return split ? Launch<true, float>(map, p, pairs) : Launch<false, float>(map, p, pairs);
  }
  return split ? Launch<true, bf16>(map, p, pairs) : Launch<false, bf16>(map, p, pairs);
}

}  // namespace moesh::cuda::mla
