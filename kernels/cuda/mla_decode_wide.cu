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
//
// kFp8 (KvCacheDtype::kFp8, FlashMLA's 656-byte rows [512 e4m3 codes | 4
// float32 power-of-two scales | 64 bf16 rope]): the same consumers over the
// same two bf16 stages; the producer warpgroup fills them as FlashMLA's FP8
// decode does (NOTES.md): its 128 threads load a tile's codes straight from
// global memory into registers (warp w rows 16 w .. 16 w + 15, lane l codes
// [16 l, 16 l + 16) of each: one coalesced 512-byte row a load), widen them
// (code times its group's scale: exact in bf16) and store them into the free
// stage's eight latent column blocks, while one lane's tensor copy brings the
// rope (bf16 in the row) into its ninth. A tile's loads are issued before
// waiting for its stage, so they fly while the consumers finish the tile
// before. full[stage] counts the copy's arrival (with its bytes) and the
// four producer warps'. Registers: warpgroup 0 224, warpgroup 1 216 (its own
// epilogue), the producer 64: four rows' loads in flight a thread, four passes
// a tile (FlashMLA keeps a tile's in flight with 152; ours do not fit there
// yet: NOTES.md), so one lane prefetches the next tile's block (41 KB,
// contiguous) into L2 with one bulk prefetch while this one is widened.
// (A ring of raw rows widened by the producer warpgroup into one bf16 tile
// ran 728.5 against this form's 493.5 us at 128 x 4096 on an H100; NOTES.md.)
// kPair (an even number of 64-head groups, V2/V3's 128 heads): the two CTAs
// of a split's heads run as one cluster and each widens half of every tile
// (32 rows) into its own stage and, with st.async, into its peer's, counted
// in transaction bytes on the peer's full[stage] (FlashMLA's split of the
// widening): a stage is refilled once both CTAs' consumers released it, so
// each CTA's empty[stage] counts both CTAs' sixteen warps. 376.6 against
// 493.1 us at 128 x 4096 on an H100 (BENCHMARKS.md). No CTA leaves while its
// peer may reach it: every byte the peer stores counts on a full[stage] this
// CTA waits for, and every release it sends is waited for by this CTA's
// producer (the last kStages tiles are released by neither). As FlashMLA's
// sparse FP8 decode, the consumers issue no proxy fence after waiting for
// the peer's st.async bytes (a helper's review: the PTX ISA does not list
// st.async among the async proxy's operations; where it would matter, a
// fence.proxy.async after the full[stage] wait is the fix).
#include <cuda.h>

#include <vector>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8_kv.cuh"
#include "kernels/cuda/mla_decode_common.cuh"
#include "kernels/cuda/mla_decode_wide_common.cuh"
#include "kernels/cuda/pdl.cuh"
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
// within the CTA, so 2 x 240 + 24 per warpgroup lane is all there is (bf16
// rows); 224 + 216 + 64 over FP8 rows.
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;  // 168
constexpr int kConsumerRegs = 240, kProducerRegs = 24;
constexpr int kFp8Wg0Regs = 224, kFp8Wg1Regs = 216, kFp8ProducerRegs = 64;
static_assert((2 * kConsumerRegs + kProducerRegs) * 128 <= kLaunchRegs * kThreads &&
                  (kFp8Wg0Regs + kFp8Wg1Regs + kFp8ProducerRegs) * 128 <= kLaunchRegs * kThreads,
              "setmaxnreg would wait forever for registers the CTA does not have");
// FP8 rows (kFp8).
constexpr cpu::Fp8KvRowLayout kFp8Row{kLatentDim, kRopeDim};
constexpr int kFp8RowBytes = kFp8Row.bytes();  // 656
constexpr int kProducerWarps = 4;
// Rows of a tile a producer warp widens: 16, or 8 when a CTA pair splits
// the tile (kPair).
template <bool kPair>
constexpr int kRowsPerProducerWarp = (kPair ? kTile / 2 : kTile) / kProducerWarps;
constexpr int kRowsPerPass = 4;  // rows a pass keeps in flight a thread
static_assert(kFp8Wg1Regs > kLaunchRegs && kRowsPerProducerWarp<true> % kRowsPerPass == 0);
// kPair: the bytes a CTA's stage receives from its peer a tile (32 rows of
// 512 bf16), and with kSel (the rope widened by the producer too) 32 rows of
// 64 more.
constexpr uint32_t kPeerTileBytes = kTile / 2 * kLatentDim * 2;
constexpr uint32_t kPeerSelTileBytes = kPeerTileBytes + kTile / 2 * kRopeDim * 2;
static_assert(kLatentDim == 32 * 16 && kFp8Row.scales_offset() == kLatentDim);
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

// The FP8 producer's passes over tile `block` (its rows in the pool): pass
// `pass` of this warp's rows from row0 (of the tile), kRowsPerPass rows' 16
// codes and scale a thread, loaded (LoadFp8Tile; the first pass before the
// stage is free) and widened into stage kv (StoreFp8Tile) and, with kPair,
// into the peer CTA's stage at remote_kv (its barrier remote_full counting
// the bytes).
struct Fp8Loads {
  uint4 codes[kRowsPerPass];
  float scale[kRowsPerPass];
};
__device__ __forceinline__ void LoadFp8Tile(const MlaDecodeParams& p, int block, int row0, int lane,
                                            int pass, Fp8Loads& f) {
  const uint8_t* rows =
      reinterpret_cast<const uint8_t*>(p.kv_cache) +
      (static_cast<int64_t>(block) * kKvBlockSize + row0 + pass * kRowsPerPass) * kFp8RowBytes;
#pragma unroll
  for (int r = 0; r < kRowsPerPass; ++r) {
    const uint8_t* row = rows + r * kFp8RowBytes;
    f.codes[r] = __ldg(reinterpret_cast<const uint4*>(row) + lane);
    f.scale[r] = __ldg(reinterpret_cast<const float*>(row + kFp8Row.scales_offset()) +
                       lane * 16 / cpu::kFp8Block);
  }
}
template <bool kPair>
__device__ __forceinline__ void StoreFp8Tile(uint8_t* kv, int row0, int lane, int pass,
                                             const Fp8Loads& f, uint32_t remote_kv,
                                             uint32_t remote_full) {
  // Column block c, chunks j and j + 1 of its row; lanes of odd blocks store
  // their second chunk first, so the eight lanes a 16-byte store serves at
  // once (two blocks, 8 KB apart: the same banks) hit eight distinct chunks.
  const int c = lane / 4, j = 2 * (lane % 4), first = c & 1;
#pragma unroll
  for (int r = 0; r < kRowsPerPass; ++r) {
    const int row = row0 + pass * kRowsPerPass + r;
    const uint2 lo = make_uint2(f.codes[r].x, f.codes[r].y),
                hi = make_uint2(f.codes[r].z, f.codes[r].w);
    const int at0 = c * kBlockBytes + wgmma::Swizzle128Offset(row, 8 * (j + first)),
              at1 = c * kBlockBytes + wgmma::Swizzle128Offset(row, 8 * (j + 1 - first));
    const uint4 v0 = fp8kv::WidenToBf16x8(first ? hi : lo, f.scale[r]),
                v1 = fp8kv::WidenToBf16x8(first ? lo : hi, f.scale[r]);
    *reinterpret_cast<uint4*>(kv + at0) = v0;
    *reinterpret_cast<uint4*>(kv + at1) = v1;
    if constexpr (kPair) {
      StAsync16(remote_kv + at0, v0, remote_full);
      StAsync16(remote_kv + at1, v1, remote_full);
    }
  }
}

// kSel (a selection, or rows wider than 656 bytes: DeepSeek-V3.2's sparse
// attention reads its top-k rows straight from the pool): a tile's rows lie
// anywhere in the pool, so no tensor copy brings the rope. Each producer
// lane k below the warp's row count holds the address of the warp's row k
// of the tile (null past the selection's end: zeros); a pass reads its four
// rows' addresses from those lanes, loads their codes and scales as
// LoadFp8Tile does, and each lane 16 bytes of one row's rope (lane l: row
// l / 8, bytes 16 (l % 8) of its 128).
__device__ __forceinline__ const uint8_t* LanePtr(const uint8_t* p, int src) {
  return reinterpret_cast<const uint8_t*>(
      __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(p), src));
}
__device__ __forceinline__ void LoadFp8SelectedRows(const uint8_t* mine, int lane, int pass,
                                                    Fp8Loads& f, uint4& rope) {
#pragma unroll
  for (int r = 0; r < kRowsPerPass; ++r) {
    const uint8_t* row = LanePtr(mine, pass * kRowsPerPass + r);  // the same in every lane
    f.codes[r] =
        row != nullptr ? __ldg(reinterpret_cast<const uint4*>(row) + lane) : make_uint4(0, 0, 0, 0);
    f.scale[r] = row != nullptr
                     ? __ldg(reinterpret_cast<const float*>(row + kFp8Row.scales_offset()) +
                             lane * 16 / cpu::kFp8Block)
                     : 0.0f;
  }
  const uint8_t* row = LanePtr(mine, pass * kRowsPerPass + lane / 8);
  rope = row != nullptr
             ? __ldg(reinterpret_cast<const uint4*>(row + kFp8Row.rope_offset()) + lane % 8)
             : make_uint4(0, 0, 0, 0);
}
// The rope LoadFp8SelectedRows brought, into the stage's ninth column block
// (and the peer's with kPair).
template <bool kPair>
__device__ __forceinline__ void StoreSelectedRope(uint8_t* kv, int row0, int lane, int pass,
                                                  uint4 rope, uint32_t remote_kv,
                                                  uint32_t remote_full) {
  const int at = (kColBlocks - 1) * kBlockBytes +
                 wgmma::Swizzle128Offset(row0 + pass * kRowsPerPass + lane / 8, 8 * (lane % 8));
  *reinterpret_cast<uint4*>(kv + at) = rope;
  if constexpr (kPair) StAsync16(remote_kv + at, rope, remote_full);
}

// A consumer warp is done with tile i of n's stage (empty). With kPair both
// CTAs' producers fill it, so it is released in both; tiles past the last
// the producers wait for (i + kStages >= n) are released in neither: no
// arrival may reach a peer that has left.
template <bool kPair>
__device__ __forceinline__ void ReleaseStage(uint64_t& empty, uint32_t peer, int i, int n) {
  if (!kPair) {
    MbarArrive(&empty);
  } else if (i + kStages < n) {
    MbarArrive(&empty);
    MbarArriveCluster(&empty, peer);
  }
}

template <bool kSplit, typename OutT, bool kFp8, bool kPair, bool kSel>
__global__ void __launch_bounds__(kThreads, 1)
    MlaDecodeWideKernel(const __grid_constant__ CUtensorMap map, MlaDecodeParams p) {
  PdlBegin();
  static_assert(kFp8 || !kPair, "only FP8 rows are widened by a CTA pair");
  static_assert(kFp8 || !kSel, "selected rows: FP8 rows only");
  extern __shared__ uint8_t smem_raw[];
  Smem& s = wide::AlignedSmem<Smem>(smem_raw);
  const wide::Cta cta = wide::CtaOf(p);
  const int split = cta.split, head0 = cta.head0, b = cta.b, seq_len = cta.seq_len, n = cta.n;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) {
      MbarInit(&s.full[st], kFp8 ? 1 + kProducerWarps : 1);
      MbarInit(&s.empty[st], kPair ? 2 * kConsumerWarps : kConsumerWarps);
    }
    FenceMbarInit();
  }
  wide::LoadQ(s.q, p, b, head0, tid, kThreads);
  wgmma::FenceProxyAsync();
  if constexpr (kPair) {
    ClusterSync();  // the peer's barriers exist before anything reaches them
  } else {
    __syncthreads();
  }
  // kPair: the other CTA of the pair (the other 64 heads of this split).
  const uint32_t peer = kPair ? ClusterCtaRank() ^ 1u : 0u;
  // The cache block of the CTA's tile i (the producers').
  const auto block_of = [&](int i) {
    return p.block_table[static_cast<int64_t>(b) * p.max_blocks_per_seq + cta.begin + i];
  };

  if (kFp8 && warp >= kConsumerWarps) {  // the FP8 producer warpgroup: all four warps
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kFp8ProducerRegs));
    const int pw = warp - kConsumerWarps;
    constexpr int kRows = kRowsPerProducerWarp<kPair>, kPasses = kRows / kRowsPerPass;
    // This warp's rows of each tile: with kPair, CTA rank r widens rows
    // [32 r, 32 r + 32) into its stage and its peer's.
    const int row0 = (kPair ? static_cast<int>(peer ^ 1u) * (kTile / 2) : 0) + pw * kRows;
    if constexpr (kSel) {
      const uint8_t* const pool = reinterpret_cast<const uint8_t*>(p.kv_cache);
      const int64_t row_bytes = static_cast<int64_t>(p.kv_row_stride) * 2;
      // Lane k < kRows: the pool address of this warp's row k of tile i.
      const auto selected_row = [&](int i) -> const uint8_t* {
        const int t = (cta.begin + i) * kTile + row0 + lane;
        if (lane >= kRows || t >= seq_len) return nullptr;
        const int pos =
            p.kv_index != nullptr ? p.kv_index[static_cast<int64_t>(b) * p.kv_index_stride + t] : t;
        const int block =
            p.block_table[static_cast<int64_t>(b) * p.max_blocks_per_seq + pos / kKvBlockSize];
        return pool + (static_cast<int64_t>(block) * kKvBlockSize + pos % kKvBlockSize) * row_bytes;
      };
      const uint8_t* next = n > 0 ? selected_row(0) : nullptr;
      if (next != nullptr) BulkPrefetchL2(next, kFp8RowBytes);
      for (int i = 0; i < n; ++i) {
        const int stage = i % kStages;
        const uint8_t* const mine = next;  // this tile's rows; the next tile's on their way
        Fp8Loads f;
        uint4 rope;
        LoadFp8SelectedRows(mine, lane, 0, f, rope);
        // After this pass's loads: the lookups for the next tile's rows (the
        // selection, then the block table) do not hold them up.
        next = i + 1 < n ? selected_row(i + 1) : nullptr;
        if (next != nullptr) BulkPrefetchL2(next, kFp8RowBytes);
        if (i >= kStages) MbarWait(&s.empty[stage], (i / kStages - 1) & 1);
        if (pw == 0 && lane == 0) {  // no tensor copy: the peer's bytes alone count in bytes
          if constexpr (kPair) {
            MbarArriveExpectTx(&s.full[stage], kPeerSelTileBytes);
          } else {
            MbarArrive(&s.full[stage]);
          }
        }
        const uint32_t remote_kv = kPair ? MapShared(s.kv[stage], peer) : 0u;
        const uint32_t remote_full = kPair ? MapShared(&s.full[stage], peer) : 0u;
        StoreFp8Tile<kPair>(s.kv[stage], row0, lane, 0, f, remote_kv, remote_full);
        StoreSelectedRope<kPair>(s.kv[stage], row0, lane, 0, rope, remote_kv, remote_full);
#pragma unroll 1
        for (int pass = 1; pass < kPasses; ++pass) {
          LoadFp8SelectedRows(mine, lane, pass, f, rope);
          StoreFp8Tile<kPair>(s.kv[stage], row0, lane, pass, f, remote_kv, remote_full);
          StoreSelectedRope<kPair>(s.kv[stage], row0, lane, pass, rope, remote_kv, remote_full);
        }
        wgmma::FenceProxyAsync();
        __syncwarp();
        if (lane == 0) MbarArrive(&s.full[stage]);
      }
      return;
    }
    const auto prefetch = [&](int i) {  // tile i's rows (one block: contiguous) into L2
      BulkPrefetchL2(reinterpret_cast<const uint8_t*>(p.kv_cache) +
                         static_cast<int64_t>(block_of(i)) * kKvBlockSize * kFp8RowBytes,
                     kKvBlockSize * kFp8RowBytes);
    };
    for (int i = 0; i < n; ++i) {
      const int stage = i % kStages, block = block_of(i);
      // The passes load from L2: the next tile's block is on its way there.
      if (pw == 0 && lane == 0 && i + 1 < n) prefetch(i + 1);
      Fp8Loads f;
      LoadFp8Tile(p, block, row0, lane, 0, f);
      // With kPair both CTAs' consumers have released the stage (here and
      // in the peer) once this CTA's empty[stage] completes.
      if (i >= kStages) MbarWait(&s.empty[stage], (i / kStages - 1) & 1);
      if (pw == 0 && lane == 0) {  // the rope: bf16 in the rows, into the ninth column block
        // (and, with kPair, the peer's half of the latent: its stores count
        // on this barrier, possibly before this arms it).
        MbarArriveExpectTx(&s.full[stage], kBlockBytes + (kPair ? kPeerTileBytes : 0));
        TmaLoad2D(&s.kv[stage][(kColBlocks - 1) * kBlockBytes], &map, kFp8Row.rope_offset() / 2,
                  block * kKvBlockSize, &s.full[stage]);
      }
      const uint32_t remote_kv = kPair ? MapShared(s.kv[stage], peer) : 0u;
      const uint32_t remote_full = kPair ? MapShared(&s.full[stage], peer) : 0u;
      StoreFp8Tile<kPair>(s.kv[stage], row0, lane, 0, f, remote_kv, remote_full);
#pragma unroll 1
      for (int pass = 1; pass < kPasses; ++pass) {
        LoadFp8Tile(p, block, row0, lane, pass, f);
        StoreFp8Tile<kPair>(s.kv[stage], row0, lane, pass, f, remote_kv, remote_full);
      }
      wgmma::FenceProxyAsync();
      __syncwarp();
      if (lane == 0) MbarArrive(&s.full[stage]);
    }
    return;
  }
  if (warp >= kConsumerWarps) {  // the producer warpgroup: one lane works
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if (warp == kConsumerWarps && lane == 0) {
      for (int i = 0; i < n; ++i) {
        const int stage = i % kStages;
        if (i >= kStages) MbarWait(&s.empty[stage], (i / kStages - 1) & 1);
        const int block = block_of(i);
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

  const int wg = tid / 128, t = tid % 128;
  // kFp8: each consumer warpgroup raises its own count first thing in its
  // branch below (a raise before a join would hold both to the smaller).
  if (!kFp8) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int g = lane / 4, tq = lane % 4;                        // accumulator row group / quad lane
  const int row_lo = (warp % 4) * 16 + g, row_hi = row_lo + 8;  // this thread's two heads
  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;

  if (wg == 0) {
    if constexpr (kFp8) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kFp8Wg0Regs));
    const float scale_log2 = p.softmax_scale * kLog2e;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int stage = i % kStages, tile = cta.begin + i;
      uint8_t* kv = s.kv[stage];
      MbarWait(&s.full[stage], (i / kStages) & 1);
      // kPair: the peer's st.async bytes are generic-proxy writes the wgmma
      // below read through the async proxy (the PTX ISA lists no st.async
      // among async-proxy operations): fence on this side of the wait.
      if constexpr (kPair) wgmma::FenceProxyAsync();
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
      const uint64_t dv = wgmma::DescMnMajor(kv, kBlockBytes);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wgmma::WgmmaM64N256K16Rs<1>(o, pa[kk], dv + wgmma::DescStep(kk * 16 * 128), 1);
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceOperands(o);
      __syncwarp();
      if (lane == 0) ReleaseStage<kPair>(s.empty[stage], peer, i, n);
    }
    wide::StoreStats(s.m, s.l, row_lo, row_hi, tq, m_lo, m_hi, l_lo, l_hi);
    BarSync(kStats, kWideThreads);
  } else {
    if constexpr (kFp8) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kFp8Wg1Regs));
    for (int i = 0; i < n; ++i) {
      const int stage = i % kStages;
      const uint8_t* kv = s.kv[stage];
      MbarWait(&s.full[stage], (i / kStages) & 1);
      if constexpr (kPair) wgmma::FenceProxyAsync();  // as warpgroup 0's
      BarSync(kPFull + stage, kWideThreads);
      __syncwarp();
      const uint8_t* const psrc = kv + (kColBlocks - 1) * kBlockBytes;
      wide::RescaleO(o, {s.alpha[stage][row_lo], s.alpha[stage][row_hi]});
      // O[:, 256:512) += P · V[:, 256:512).
      wgmma::FenceOperands(o);
      wgmma::Fence();
      const uint64_t dp = wgmma::DescKMajor(psrc),
                     dv = wgmma::DescMnMajor(kv + (kOutDims / 64) * kBlockBytes, kBlockBytes);
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wgmma::WgmmaM64N256K16<1>(o, dp + wgmma::DescStep(kk * 32),
                                  dv + wgmma::DescStep(kk * 16 * 128), 1);
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceOperands(o);
      __syncwarp();
      if (lane == 0) ReleaseStage<kPair>(s.empty[stage], peer, i, n);
    }
    BarSync(kStats, kWideThreads);
    if constexpr (kFp8) {  // its own epilogue: a shared one would hold it to 216 registers
      wide::WriteOut<kSplit, OutT>(p, o, b, split, head0, 1, row_lo, tq, s.m, s.l, n);
      return;
    }
  }
  wide::WriteOut<kSplit, OutT>(p, o, b, split, head0, wg, row_lo, tq, s.m, s.l, n);
}

// The paged cache as a 2-D tensor [num_blocks * 64 rows, 576] of bf16, read
// in 64 x 64 boxes swizzled for SW128; FP8 rows as [rows, 328] bf16 (rows
// kv_row_stride apart), of which the kernel copies the rope's 64 (not with
// kSel: then the map goes unused).
absl::StatusOr<CUtensorMap> CacheMap(const MlaDecodeParams& p) {
  const uint64_t rows = static_cast<uint64_t>(p.num_blocks) * kKvBlockSize;
  if (p.kv_dtype == KvCacheDtype::kFp8) {
    return Bf16BoxMap64(p.kv_cache, rows, kFp8RowBytes / 2,
                        p.kv_row_stride != 0 ? p.kv_row_stride : kFp8RowBytes / 2,
                        "the FP8 KV cache's rope");
  }
  return Bf16BoxMap64(p.kv_cache, rows, kHeadDim, kHeadDim, "the KV cache");
}

template <bool kSplit, typename OutT, bool kFp8, bool kPair, bool kSel>
absl::Status Launch(const CUtensorMap& map, const MlaDecodeParams& p) {
  constexpr auto kernel = MlaDecodeWideKernel<kSplit, OutT, kFp8, kPair, kSel>;
  RETURN_IF_ERROR(AllowDynamicSmem<kernel>(kSmemBytes));
  const dim3 grid(p.num_splits, (p.num_heads + kWideHeads - 1) / kWideHeads, p.batch);
  if constexpr (!kPair) {
    RETURN_IF_ERROR(
        LaunchPdl("MlaDecodeWideKernel", kernel, grid, kThreads, kSmemBytes, p.stream, map, p));
  } else {  // the two CTAs of a split's 128 heads as one cluster
    RETURN_IF_ERROR(LaunchPdlCluster("MlaDecodeWideKernel", kernel, grid, kThreads, kSmemBytes,
                                     p.stream, dim3(1, 2, 1), map, p));
  }
  return absl::OkStatus();
}

// CacheMap(p), encoded once per (cache pointer, block count, dtype, row
// stride) and thread: a map depends on nothing else, so one made for memory since freed and
// reallocated at the same address with the same size is still right.
absl::StatusOr<CUtensorMap> CachedCacheMap(const MlaDecodeParams& p) {
  struct Entry {
    const void* cache;
    int num_blocks;
    KvCacheDtype dtype;
    int row_stride;
    CUtensorMap map;
  };
  thread_local std::vector<Entry> maps;  // few: one per pool (or layer) a thread runs
  for (const Entry& e : maps) {
    if (e.cache == p.kv_cache && e.num_blocks == p.num_blocks && e.dtype == p.kv_dtype &&
        e.row_stride == p.kv_row_stride) {
      return e.map;
    }
  }
  ASSIGN_OR_RETURN(const CUtensorMap map, CacheMap(p));
  if (maps.size() >= 256) maps.clear();  // bounded
  maps.push_back({p.kv_cache, p.num_blocks, p.kv_dtype, p.kv_row_stride, map});
  return map;
}

template <bool kFp8, bool kPair, bool kSel = false>
absl::Status LaunchWith(const CUtensorMap& map, const MlaDecodeParams& p) {
  const bool split = p.num_splits > 1;
  if (p.out_type == OutType::kFloat32) {
    return split ? Launch<true, float, kFp8, kPair, kSel>(map, p)
                 : Launch<false, float, kFp8, kPair, kSel>(map, p);
  }
  return split ? Launch<true, bf16, kFp8, kPair, kSel>(map, p)
               : Launch<false, bf16, kFp8, kPair, kSel>(map, p);
}

}  // namespace

absl::Status LaunchMlaDecodeWide(const MlaDecodeParams& p) {
  ASSIGN_OR_RETURN(const CUtensorMap map, CachedCacheMap(p));
  if (p.kv_dtype != KvCacheDtype::kFp8) return LaunchWith<false, false>(map, p);
  // FP8 rows: a pair of CTAs (an even number of 64-head groups) widens each
  // tile once for both, half each.
  const int groups = (p.num_heads + kWideHeads - 1) / kWideHeads;
  // Selected or strided rows (RunMlaDecode has checked the stride).
  if (p.kv_index != nullptr || (p.kv_row_stride != 0 && p.kv_row_stride != kFp8RowBytes / 2)) {
    MlaDecodeParams q = p;  // the kernel reads the row stride (dense: 328)
    if (q.kv_row_stride == 0) q.kv_row_stride = kFp8RowBytes / 2;
    return groups % 2 == 0 ? LaunchWith<true, true, true>(map, q)
                           : LaunchWith<true, false, true>(map, q);
  }
  return groups % 2 == 0 ? LaunchWith<true, true>(map, p) : LaunchWith<true, false>(map, p);
}

}  // namespace moesh::cuda::mla
