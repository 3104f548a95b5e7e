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
#include "kernels/cuda/mla_decode_wide_common.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace moesh::cuda::mla {
namespace {

using wide::kBlockBytes;
using wide::kORegs;
using wide::kOutDims;
using wide::kSRegs;
using wide::kTile;
constexpr int kStages = 2;                            // tiles in flight
constexpr int kColBlocks = wide::kQBlocks;            // 9 SW128 column blocks of a row
constexpr int kTileBytes = kColBlocks * kBlockBytes;  // 72 KB: Q, or one KV tile
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

template <bool kSplit, typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    MlaDecodeWideKernel(const __grid_constant__ CUtensorMap map, MlaDecodeParams p) {
  extern __shared__ uint8_t smem_raw[];
  Smem& s = wide::AlignedSmem<Smem>(smem_raw);
  const wide::Cta cta = wide::CtaOf(p);
  const int split = cta.split, head0 = cta.head0, b = cta.b, seq_len = cta.seq_len, n = cta.n;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) {
      MbarInit(&s.full[st], 1);
      MbarInit(&s.empty[st], kConsumerWarps);
    }
    FenceMbarInit();
  }
  wide::LoadQ(s.q, p, b, head0, tid, kThreads);
  wgmma::FenceProxyAsync();
  __syncthreads();

  if (warp >= kConsumerWarps) {  // the producer warpgroup: one lane works
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if (warp == kConsumerWarps && lane == 0) {
      for (int i = 0; i < n; ++i) {
        const int stage = i % kStages;
        if (i >= kStages) MbarWait(&s.empty[stage], (i / kStages - 1) & 1);
        const int block =
            p.block_table[static_cast<int64_t>(b) * p.max_blocks_per_seq + cta.begin + i];
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
      const int stage = i % kStages, tile = cta.begin + i;
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

      // Scale, mask, softmax; P and its rescale to warpgroup 1 in this stage:
      // P over the rope column block, which S was the last to read.
      uint32_t pa[kTile / 16][4];
      const wide::Rescale alpha =
          wide::SoftmaxTile(sc, tile, seq_len, scale_log2, tq, m_lo, m_hi, l_lo, l_hi, o, pa);
      wide::StoreP(kv + (kColBlocks - 1) * kBlockBytes, s.alpha[stage], pa, row_lo, row_hi, tq,
                   alpha);
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
    wide::StoreStats(s.m, s.l, row_lo, row_hi, tq, m_lo, m_hi, l_lo, l_hi);
    BarSync(kStats, kWideThreads);
  } else {
    for (int i = 0; i < n; ++i) {
      const int stage = i % kStages;
      const uint8_t* kv = s.kv[stage];
      MbarWait(&s.full[stage], (i / kStages) & 1);
      BarSync(kPFull + stage, kWideThreads);
      __syncwarp();
      const uint8_t* const psrc = kv + (kColBlocks - 1) * kBlockBytes;
      wide::RescaleO(o, {s.alpha[stage][row_lo], s.alpha[stage][row_hi]});
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
  wide::WriteOut<kSplit, OutT>(p, o, b, split, head0, wg, row_lo, tq, s.m, s.l, n);
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
