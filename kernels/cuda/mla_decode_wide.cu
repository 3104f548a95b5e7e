// MLA decode with 64 heads per CTA (MlaTileConfig::kHeads64Tokens64Stages2),
// for the wide-head models (V2/V3/V3.2: 128 heads): each cache byte a CTA
// streams serves 64 heads, so a sequence's KV crosses L2 num_heads / 64 times
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
//     P as bf16 into the scored tile's rope column block (free once S is
//     done) with its rescale factors beside the stage, then
//     O[:, 0:256) += P · V with P from registers (m64n256k16, A in registers);
//   * warpgroup 1: O[:, 256:512) += P · V with P from that stage, while
//     warpgroup 0 already scores the next tile.
// P and its rescale travel with the stage, so warpgroup 0 never waits for
// warpgroup 1's product before the next P: one named barrier a stage
// (kPFull + stage: 0 arrives, 1 syncs) hands them over. A stage is refilled
// only after both released it, so what 0 writes there cannot be overwritten
// early, and 0 cannot arrive twice on one stage's barrier before 1 synced on
// it. (P in a buffer of its own, which 0 could refill only once 1 was done
// with it, ran 325.2 against 298.8 us at 128 x 4096 on an H100; NOTES.md.)
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
constexpr int kStats = 1, kWg0 = 2, kPFull = 3;  // kPFull + stage
static_assert(kWideHeads == 64 && kWideThreads == 256 && kHeadDim % 64 == 0);

struct Smem {
  uint8_t q[kTileBytes];               // [64 heads, 576], SW128 column blocks
  uint8_t kv[kStages][kTileBytes];     // [64 tokens, 576] per stage
  float alpha[kStages][kWideHeads];    // per head: the rescale of O that goes with a stage's P
  float m[kWideHeads], l[kWideHeads];  // per head, after the last tile (log2 units)
  alignas(8) uint64_t full[kStages], empty[kStages];
};
// 1 KB of slack to align the dynamic shared memory to 1024 bytes (SW128).
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem)) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "over Hopper's shared memory per CTA");

// The named barriers (BarSync / BarArrive, async_copy.cuh) hand over one
// way: making warpgroup 0 also wait at kPFull cost 20% (287 -> 357 us at 128 x
// 4096). compute-sanitizer's racecheck reports hazards on the plain
// shared-memory traffic these barriers order (alpha; and m, l even behind the
// two-sided kStats), with two-sided syncs as well, so tools/device/tests.sh
// runs racecheck on the 16-head kernel only.

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
template <bool kSplit, typename OutT>
__device__ __forceinline__ void WriteOut(const MlaDecodeParams& p, const float (&o)[kORegs], int b,
                                         int split, int head0, int wg, int row_lo, int tq,
                                         const Smem& s, int n) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = row_lo + half * 8, h = head0 + row;
    if (h >= p.num_heads) continue;
    const float l = s.l[row], m = s.m[row];
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
  // Q rows (zeros past num_heads) into SW128 column blocks.
  for (int i = tid; i < kWideHeads * kColBlocks * 8; i += kThreads) {
    const int row = i / (kColBlocks * 8), chunk = i % (kColBlocks * 8), h = head0 + row;
    const uint4 v = h < p.num_heads
                        ? reinterpret_cast<const uint4*>(
                              p.q + (static_cast<int64_t>(b) * p.num_heads + h) * kHeadDim)[chunk]
                        : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(s.q + (chunk / 8) * kBlockBytes +
                              wgmma::Swizzle128Offset(row, (chunk % 8) * 8)) = v;
  }
  wgmma::FenceProxyAsync();
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
      // Hand P and alpha to warpgroup 1 in this stage: P over the rope
      // column block, which S was the last to read.
      uint8_t* const pdst = kv + (kColBlocks - 1) * kBlockBytes;
      float* const alpha_dst = s.alpha[stage];
#pragma unroll
      for (int j = 0; j < kSRegs / 4; ++j) {
        const int col = j * 8 + 2 * tq;
        *reinterpret_cast<uint32_t*>(pdst + wgmma::Swizzle128Offset(row_lo, col)) =
            pa[j / 2][(j % 2) * 2 + 0];
        *reinterpret_cast<uint32_t*>(pdst + wgmma::Swizzle128Offset(row_hi, col)) =
            pa[j / 2][(j % 2) * 2 + 1];
      }
      if (tq == 0) alpha_dst[row_lo] = alpha_lo, alpha_dst[row_hi] = alpha_hi;
      wgmma::FenceProxyAsync();
      __syncwarp();
      BarArrive(kPFull + stage, kWideThreads);

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
      BarSync(kPFull + stage, kWideThreads);
      __syncwarp();
      const uint8_t* const psrc = kv + (kColBlocks - 1) * kBlockBytes;
      const float* const alpha_src = s.alpha[stage];
      const float alpha_lo = alpha_src[row_lo], alpha_hi = alpha_src[row_hi];
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
            o, wgmma::DescKMajor(psrc + kk * 32),
            wgmma::DescMnMajor(kv + (kOutDims / 64) * kBlockBytes + kk * 16 * 128, kBlockBytes), 1);
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceOperands(o);
      __syncwarp();
      if (lane == 0) MbarArrive(&s.empty[stage]);
    }
    BarSync(kStats, kWideThreads);
  }
  WriteOut<kSplit, OutT>(p, o, b, split, head0, wg, row_lo, tq, s, n);
}

// The paged cache as a 2-D tensor [num_blocks * 64 rows, 576] of bf16, read
// in 64 x 64 boxes swizzled for SW128.
absl::StatusOr<CUtensorMap> CacheMap(const MlaDecodeParams& p) {
  return Bf16BoxMap64(p.kv_cache, static_cast<uint64_t>(p.num_blocks) * kKvBlockSize, kHeadDim,
                      kHeadDim, "the KV cache");
}

template <bool kSplit, typename OutT>
absl::Status Launch(const CUtensorMap& map, const MlaDecodeParams& p) {
  constexpr auto kernel = MlaDecodeWideKernel<kSplit, OutT>;
  RETURN_IF_ERROR(AllowDynamicSmem<kernel>(kSmemBytes));
  const dim3 grid(p.num_splits, (p.num_heads + kWideHeads - 1) / kWideHeads, p.batch);
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

absl::Status LaunchMlaDecodeWide(const MlaDecodeParams& p) {
  ASSIGN_OR_RETURN(const CUtensorMap map, CachedCacheMap(p));
  const bool split = p.num_splits > 1;
  if (p.out_type == OutType::kFloat32) {
    return split ? Launch<true, float>(map, p) : Launch<false, float>(map, p);
  }
  return split ? Launch<true, bf16>(map, p) : Launch<false, bf16>(map, p);
}

}  // namespace moesh::cuda::mla
