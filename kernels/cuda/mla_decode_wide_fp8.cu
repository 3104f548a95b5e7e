// MLA decode over FP8 rows (KvCacheDtype::kFp8: 656-byte rows of
// cpu::Fp8KvRowLayout, [512 e4m3 codes | 4 float32 power-of-two scales | 64
// bf16 rope]) with 64 heads per CTA (MlaTileConfig::kHeads64Tokens64Stages2),
// for the wide-head models: mla_decode_wide.cu's kernel with its tile's latent
// widened to bf16 in shared memory once per tile for all 64 heads (the
// 16-head FP8 kernel widens each tile once per 16 heads, eight CTAs re-reading
// it at 128 heads).
//
// One CTA = (KV split, group of 64 heads, sequence); Q [64 heads, 576] bf16
// in shared memory (SW128 column blocks) for the whole CTA. Shared memory
// holds Q (72 KB), one bf16 latent tile [64 tokens, 512] (64 KB, SW128) and
// a two-stage ring of the raw rows (41 KB a stage): the codes as two
// [64, 256] byte boxes, the scales as a [64, 16] box, the rope as one SW128
// [64, 64] bf16 box (tensor copies: ByteBoxMap and Bf16BoxMap64).
//   * The producer warpgroup: lane 0 of its first warp issues tile i + 1's
//     copies into the ring (full[stage]) once tile i - 1 is consumed, while
//     tile i is widened; all 128 threads widen the tile the consumers take
//     next once both consumer warpgroups have released the bf16 tile
//     (kv_empty): each thread 32 chunks of 8
//     codes, code (an exact f16) times its power-of-two scale, exactly a bf16,
//     into the swizzled tile; rows past the sequence's end become zeros, and
//     their rope rows in the ring too. kv_full tells the consumers.
//   * Warpgroup 0: S = Q · K^T over the eight latent column blocks of the bf16
//     tile and the rope block of the ring stage, the online softmax, P into
//     the stage's rope block (S was its last reader) with the rescale beside
//     it (kPFull + stage), then O[:, 0:256) += P · V from registers.
//   * Warpgroup 1: O[:, 256:512) += P · V with P from the stage.
// Each consumer warp releases the ring stage (empty[stage]) and the bf16 tile
// (kv_empty) after its product. The widening is not overlapped with the
// products (one bf16 tile fits beside Q and the ring, two do not).
// Splits write (O / l, log2-sum-exp) partials for mla_decode.cu's combine.
#include <cuda.h>
#include <cuda_fp16.h>

#include <vector>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8_kv.cuh"
#include "kernels/cuda/mla_decode_common.cuh"
#include "kernels/cuda/mla_decode_wide_common.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace moesh::cuda::mla {
namespace {

constexpr cpu::Fp8KvRowLayout kRow{kLatentDim, kRopeDim};
constexpr int kRowBytes = kRow.bytes();  // 656
using wide::kBlockBytes;
using wide::kORegs;
using wide::kOutDims;
using wide::kSRegs;
using wide::kTile;
constexpr int kStages = 2;                             // ring stages
constexpr int kLatentBlocks = kLatentDim / 64;         // 8 column blocks of the latent
constexpr int kQBytes = wide::kQBlocks * kBlockBytes;  // Q: 9 column blocks
constexpr int kCodeBox = 256;                          // bytes of a row a code box holds
constexpr int kThreads = kWideThreads + 128;
constexpr int kConsumerRegs = 224, kProducerRegs = 56;
static_assert((2 * kConsumerRegs + kProducerRegs) * 128 <= 65536 / kThreads / 8 * 8 * kThreads,
              "setmaxnreg would wait forever for registers the CTA does not have");
constexpr int kConsumerWarps = kWideThreads / 32;
constexpr int kProducerWarps = 4;
// Named barriers (0 is __syncthreads).
constexpr int kStats = 1, kPFull = 2;  // kPFull + stage
static_assert(kWideHeads == 64 && kWideThreads == 256 && kRowBytes == 656);
static_assert(kRow.scales_offset() == 2 * kCodeBox && kRow.rope_offset() % 2 == 0);

struct Stage {
  uint8_t rope[kBlockBytes];          // [64 tokens, 64] bf16, SW128; P after S
  uint8_t codes[2][kTile][kCodeBox];  // latent codes [0, 256) and [256, 512) of each row
  uint8_t scales[kTile][16];          // four float32 scales a row
};
static_assert(sizeof(Stage) % 1024 == 0, "each stage's rope block on a 1024-byte boundary");

struct Smem {
  uint8_t q[kQBytes];                       // [64 heads, 576], SW128 column blocks
  uint8_t kv[kLatentBlocks * kBlockBytes];  // [64 tokens, 512] bf16, SW128
  Stage ring[kStages];
  float alpha[kStages][kWideHeads];    // per head: the rescale of O that goes with a stage's P
  float m[kWideHeads], l[kWideHeads];  // per head, after the last tile (log2 units)
  alignas(8) uint64_t full[kStages], empty[kStages], kv_full, kv_empty;
};
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem)) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "over Hopper's shared memory per CTA");

struct Maps {
  CUtensorMap codes, scales, rope;
};

// The producer warpgroup's widening of the tile in `st` into the bf16 tile:
// `valid` rows of the sequence, the rest zeros (and their rope rows in the
// ring, which the copy filled from whatever the pool holds there).
__device__ __forceinline__ void WidenTile(Smem& s, Stage& st, int valid, int t) {
  // Chunk q: row q / 64, column block (q / 8) % 8, chunk q % 8 of the block's
  // row (dims 64 c + 8 j .. + 8). A warp covers half a row's 64 chunks.
  const int c = (t >> 3) & 7, j = t & 7;
  const int half = c >> 2, off = (c & 3) * 64 + 8 * j, group = c >> 1;
#pragma unroll 2
  for (int row = t >> 6; row < kTile; row += 2) {
    uint4 v = make_uint4(0, 0, 0, 0);
    if (row < valid) {
      const uint2 codes = *reinterpret_cast<const uint2*>(&st.codes[half][row][off]);
      const float scale = reinterpret_cast<const float*>(st.scales[row])[group];
      v = fp8kv::WidenToBf16x8(codes, scale);
    }
    *reinterpret_cast<uint4*>(s.kv + c * kBlockBytes + wgmma::Swizzle128Offset(row, 8 * j)) = v;
  }
  // Rope rows past the end: 8 chunks of 16 bytes each (their order in the row
  // does not matter for zeros).
  for (int i = t; i < (kTile - valid) * 8; i += 128) {
    *reinterpret_cast<uint4*>(st.rope + (valid + i / 8) * 128 + (i % 8) * 16) =
        make_uint4(0, 0, 0, 0);
  }
}

template <bool kSplit, typename OutT>
__global__ void __launch_bounds__(kThreads, 1)
    MlaDecodeWideFp8Kernel(const __grid_constant__ Maps maps, MlaDecodeParams p) {
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
    MbarInit(&s.kv_full, kProducerWarps);
    MbarInit(&s.kv_empty, kConsumerWarps);
    FenceMbarInit();
  }
  wide::LoadQ(s.q, p, b, head0, tid, kThreads);
  wgmma::FenceProxyAsync();
  __syncthreads();

  const auto block_of = [&](int i) {
    return p.block_table[static_cast<int64_t>(b) * p.max_blocks_per_seq + cta.begin + i];
  };
  if (warp >= kConsumerWarps) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    const int t = tid - kWideThreads;
    const bool issuer = t == 0;
    const auto issue = [&](int i) {  // tile i's copies into stage i % 2 (its last user done)
      const int stage = i % kStages;
      if (i >= kStages) MbarWait(&s.empty[stage], (i / kStages - 1) & 1);
      const int y = block_of(i) * kKvBlockSize;
      Stage& st = s.ring[stage];
      MbarArriveExpectTx(&s.full[stage], sizeof(st.codes) + sizeof(st.scales) + kBlockBytes);
      TmaLoad2D(st.codes[0], &maps.codes, 0, y, &s.full[stage]);
      TmaLoad2D(st.codes[1], &maps.codes, kCodeBox, y, &s.full[stage]);
      TmaLoad2D(st.scales, &maps.scales, kRow.scales_offset(), y, &s.full[stage]);
      TmaLoad2D(st.rope, &maps.rope, kRow.rope_offset() / 2, y, &s.full[stage]);
    };
    if (issuer) {
      for (int i = 0; i < min(n, kStages); ++i) issue(i);
    }
    for (int i = 0; i < n; ++i) {
      const int stage = i % kStages;
      if (i >= 1) MbarWait(&s.kv_empty, (i - 1) & 1);  // both consumers done with tile i - 1
      // Tile i + 1 into the stage tile i - 1 used (released with kv_empty).
      if (issuer && i >= 1 && i + 1 < n) issue(i + 1);
      MbarWait(&s.full[stage], (i / kStages) & 1);
      WidenTile(s, s.ring[stage], min(kTile, seq_len - (cta.begin + i) * kTile), t);
      wgmma::FenceProxyAsync();
      __syncwarp();
      if (lane == 0) MbarArrive(&s.kv_full);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  // A consumer warp done with a tile: the ring stage (first) and the bf16
  // tile go back to the producer warpgroup.
  const auto release = [&](int stage) {
    __syncwarp();
    if (lane == 0) {
      MbarArrive(&s.empty[stage]);
      MbarArrive(&s.kv_empty);
    }
  };
  const int wg = tid / 128;
  const int g = lane / 4, tq = lane % 4;
  const int row_lo = (warp % 4) * 16 + g, row_hi = row_lo + 8;
  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;

  if (wg == 0) {
    const float scale_log2 = p.softmax_scale * kLog2e;
    float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
    for (int i = 0; i < n; ++i) {
      const int stage = i % kStages, tile = cta.begin + i;
      Stage& st = s.ring[stage];
      MbarWait(&s.kv_full, i & 1);
      // The rope block is the copy's: wait on its own barrier too (its phase
      // has completed: the producer waited on it before kv_full).
      MbarWait(&s.full[stage], (i / kStages) & 1);
      __syncwarp();  // the wgmma below are warp-synchronous
      // S[64 heads, 64 tokens] over the latent (bf16 tile) and the rope (ring).
      float sc[kSRegs];
#pragma unroll
      for (int r = 0; r < kSRegs; ++r) sc[r] = 0.0f;
      wgmma::FenceOperands(sc);
      wgmma::Fence();
#pragma unroll
      for (int c = 0; c < kLatentBlocks; ++c) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          wgmma::WgmmaM64N64K16<0>(sc, wgmma::DescKMajor(s.q + c * kBlockBytes + kk * 32),
                                   wgmma::DescKMajor(s.kv + c * kBlockBytes + kk * 32), 1);
        }
      }
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        wgmma::WgmmaM64N64K16<0>(sc, wgmma::DescKMajor(s.q + kLatentBlocks * kBlockBytes + kk * 32),
                                 wgmma::DescKMajor(st.rope + kk * 32), 1);
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceOperands(sc);

      // Softmax; P and its rescale to warpgroup 1 over the stage's rope block.
      uint32_t pa[kTile / 16][4];
      const wide::Rescale alpha =
          wide::SoftmaxTile(sc, tile, seq_len, scale_log2, tq, m_lo, m_hi, l_lo, l_hi, o, pa);
      wide::StoreP(st.rope, s.alpha[stage], pa, row_lo, row_hi, tq, alpha);
      __syncwarp();
      BarArrive(kPFull + stage, kWideThreads);

      // O[:, 0:256) += P · V[:, 0:256) (the bf16 tile's first four blocks).
      wgmma::FenceOperands(o);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wgmma::WgmmaM64N256K16Rs<1>(o, pa[kk],
                                    wgmma::DescMnMajor(s.kv + kk * 16 * 128, kBlockBytes), 1);
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceOperands(o);
      release(stage);
    }
    wide::StoreStats(s.m, s.l, row_lo, row_hi, tq, m_lo, m_hi, l_lo, l_hi);
    BarSync(kStats, kWideThreads);
  } else {
    for (int i = 0; i < n; ++i) {
      const int stage = i % kStages;
      const Stage& st = s.ring[stage];
      MbarWait(&s.kv_full, i & 1);
      BarSync(kPFull + stage, kWideThreads);
      __syncwarp();
      wide::RescaleO(o, {s.alpha[stage][row_lo], s.alpha[stage][row_hi]});
      // O[:, 256:512) += P · V[:, 256:512).
      wgmma::FenceOperands(o);
      wgmma::Fence();
#pragma unroll
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wgmma::WgmmaM64N256K16<1>(
            o, wgmma::DescKMajor(st.rope + kk * 32),
            wgmma::DescMnMajor(s.kv + (kOutDims / 64) * kBlockBytes + kk * 16 * 128, kBlockBytes),
            1);
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceOperands(o);
      release(stage);
    }
    BarSync(kStats, kWideThreads);
  }
  wide::WriteOut<kSplit, OutT>(p, o, b, split, head0, wg, row_lo, tq, s.m, s.l, n);
}

// The pool's FP8 rows as byte boxes (codes, scales) and the rope as bf16,
// encoded once per (cache pointer, block count) and thread.
absl::StatusOr<Maps> CachedMaps(const MlaDecodeParams& p) {
  struct Entry {
    const void* cache;
    int num_blocks;
    Maps maps;
  };
  thread_local std::vector<Entry> cached;
  for (const Entry& e : cached) {
    if (e.cache == p.kv_cache && e.num_blocks == p.num_blocks) return e.maps;
  }
  const uint64_t rows = static_cast<uint64_t>(p.num_blocks) * kKvBlockSize;
  Maps maps;
  ASSIGN_OR_RETURN(maps.codes, ByteBoxMap(p.kv_cache, rows, kRowBytes, kRowBytes, kCodeBox, kTile,
                                          "the FP8 KV cache's codes"));
  ASSIGN_OR_RETURN(maps.scales, ByteBoxMap(p.kv_cache, rows, kRowBytes, kRowBytes, 16, kTile,
                                           "the FP8 KV cache's scales"));
  ASSIGN_OR_RETURN(maps.rope, Bf16BoxMap64(p.kv_cache, rows, kRowBytes / 2, kRowBytes / 2,
                                           "the FP8 KV cache's rope"));
  if (cached.size() >= 256) cached.clear();  // bounded
  cached.push_back({p.kv_cache, p.num_blocks, maps});
  return maps;
}

template <bool kSplit, typename OutT>
absl::Status Launch(const Maps& maps, const MlaDecodeParams& p) {
  constexpr auto kernel = MlaDecodeWideFp8Kernel<kSplit, OutT>;
  RETURN_IF_ERROR(AllowDynamicSmem<kernel>(kSmemBytes));
  const dim3 grid(p.num_splits, (p.num_heads + kWideHeads - 1) / kWideHeads, p.batch);
  kernel<<<grid, kThreads, kSmemBytes, p.stream>>>(maps, p);
  return LaunchStatus("MlaDecodeWideFp8Kernel");
}

}  // namespace

absl::Status LaunchMlaDecodeWideFp8(const MlaDecodeParams& p) {
  ASSIGN_OR_RETURN(const Maps maps, CachedMaps(p));
  const bool split = p.num_splits > 1;
  if (p.out_type == OutType::kFloat32) {
    return split ? Launch<true, float>(maps, p) : Launch<false, float>(maps, p);
  }
  return split ? Launch<true, bf16>(maps, p) : Launch<false, bf16>(maps, p);
}

}  // namespace moesh::cuda::mla
