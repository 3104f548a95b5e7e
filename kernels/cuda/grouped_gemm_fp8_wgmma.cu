// The FP8 x FP8 grouped GEMM (GroupedGemmParams::x_fp8) at prefill tiles, on
// wgmma, persistent, in CTA pairs: clusters of two CTAs (as many pairs as run
// at once, cudaOccupancyMaxActiveClusters) walk the cluster steps in order,
// u = clusterid, + nclusterid, ...; step u takes the 128-row tiles 2q and
// 2q + 1 (q = u / column blocks, counting tiles through the experts) at
// column block u % column blocks, one for each CTA, so the pairs working at
// one time share an expert's weights and rows in L2. Where both tiles belong
// to one expert (most of the bench's pairs; ~78% by a count outside the repo) each CTA's producer
// copies half of the weights' 256-row slice into both CTAs (a multicast tensor copy): each slice of
// B leaves L2 once for the pair. Three warpgroups a CTA:
//   * the producer warpgroup (one lane) streams 128-wide k slices (one scale
//     block) of each of its items into a four-stage ring with 2-D tensor
//     copies, 64-row x 128-byte boxes swizzled by the copy engine (SW128; the
//     e4m3 codes read through a bf16 map of half the columns — the copy moves
//     bytes): the slice of A [128 rows, 128] and of B [256 rows, 128],
//     completing on full[stage]. The ring runs on across items, so the next
//     item's slices land while the consumers store this one's outputs; a
//     stage is reused once the eight consumer warps of both CTAs arrived on
//     empty[stage] (the peer's through `mapa`, at the default release
//     semantics: .release.cluster compiled to MEMBARs that waited for the
//     thread's loads and stores in flight each slice, and made the pairs 0.69x
//     the single-CTA kernel);
//   * consumer warpgroup w owns rows [64 w, 64 w + 64) of the item, all 256
//     columns, a 128-column half at a time through the same 64 fp32
//     registers: four wgmma m64n128k32 e4m3 (A and B K-major in shared
//     memory) into fresh sums, then promoted into the running ones times
//     x_scale[row, slice] · w_scale[half, slice] (Hopper's FP8 wgmma keeps
//     ~13 mantissa bits inside an instruction's sums: no two blocks meet
//     there, as DeepGEMM). 256 columns an item (against 128) cut the bytes
//     each FLOP draws from L2 by a quarter.
// An odd tile out (the last) is computed again by rank 1 without storing it,
// so both rings turn alike; cluster barriers after the barriers' init and
// before exit (no CTA leaves while its peer may still arrive on its barriers).
// Outputs leave through shared memory in 16-byte coalesced stores (StoreOut).
// Measured (H100, kernel_bench --fp8-grouped, BENCHMARKS twentieth session):
// V3's gate_up 964-1021 TFLOP/s, down 819-921 (bf16 out) and 755-774 (fp32),
// 0.68-0.77 of cuBLASLt's dense FP8 GEMM of the same rows.
// A's rows past the expert's belong to the next expert (or read as zeros
// past the matrix) and B's past n to the next expert: neither is stored.
// Items are found from the device's expert offsets (no host sync: the grid
// is the pairs that fit, and capturable).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "base/status.h"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/grouped_tiles.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace moesh::cuda {
namespace {

constexpr int kPermutationTile = 64;  // the permutation's prefill tile (tile_m) it serves
constexpr int kWgRows = 64;           // rows a consumer warpgroup (wgmma's m)
constexpr int kConsumerWgs = 2;
constexpr int kRows = kWgRows * kConsumerWgs;  // 128 rows an item
constexpr int kHalfCols = 128;                 // one wgmma n, one weight scale row block
constexpr int kCols = 2 * kHalfCols;           // 256 output columns an item
constexpr int kHalves = kCols / kHalfCols;
constexpr int kSliceK = cpu::kFp8Block;  // 128 codes = 128 bytes: one SW128 row
constexpr int kBoxBytes = 64 * 128;      // one 64-row box
constexpr int kThreads = 128 * (kConsumerWgs + 1);
constexpr int kConsumerWarps = 4 * kConsumerWgs;
constexpr int kConsumerRegs = 232, kProducerRegs = 40;
// setmaxnreg.inc draws on the CTA's launch allocation: 65536 / 384 threads,
// rounded down to a multiple of 8 = 168 a thread.
static_assert((kConsumerWgs * kConsumerRegs + kProducerRegs) * 128 <=
                  65536 / kThreads / 8 * 8 * kThreads,
              "setmaxnreg would wait forever for registers the CTA does not have");

constexpr int kClusterCtas = 2;  // a pair sharing the weights' slices
constexpr int kStages = 4;       // 48 KB a stage
// Outputs leave through shared memory (StoreOut): a warpgroup's 64 rows of
// 128 bytes a round, in two buffers so a round's stores overlap the next
// round's copies.
constexpr int kOutBytes = kWgRows * 128;  // 8 KB
struct Smem {
  uint8_t a[kStages][kRows * kSliceK];  // [128 rows, 128 codes], SW128: two boxes
  uint8_t b[kStages][kCols * kSliceK];  // [256 rows, 128 codes]: four boxes
  uint8_t out[kConsumerWgs][2][kOutBytes];
  alignas(8) uint64_t full[kStages], empty[kStages];
};
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem)) + 1024;  // + 1024-byte alignment
static_assert(kSmemBytes <= 227 * 1024, "over Hopper's shared memory per CTA");

// x_fp8 [x_scale_ld rows, ldx] and w_fp8 [num_experts * n, k] as bf16
// tensors of half the columns, read in 64 x 64 boxes.
struct Maps {
  CUtensorMap a, b;
};

// One work item: expert e's rows [m0, m0 + 128) (of `rows`, from row0 of the
// permuted matrix), output columns [n0, n0 + 256); computed but not stored
// where !store.
struct Item {
  int e, row0, rows, m0, n0;
  bool store;
};

// The walk over a cluster's steps in order: step u takes the 128-row tiles
// 2q and 2q + 1 (q = u / col_blocks, counting tiles through the experts) at
// column block u % col_blocks, one for each CTA of the pair. Each thread
// that needs the items walks them itself (the producer lane and every
// consumer thread: the same sequence); u only grows, so a walk over the
// experts is one pass.
class ItemWalk {
 public:
  __device__ ItemWalk(const int32_t* offsets, int num_experts, int col_blocks)
      : offsets_(offsets), num_experts_(num_experts), col_blocks_(col_blocks) {}

  // Step u's item for CTA `rank`, and whether both CTAs' items read the same
  // weight rows (one expert, one column block: the pair shares B's slices);
  // false past the last step. Where the tiles run out at 2q, rank 1 repeats
  // rank 0's item without storing it (its CTA still fills its half of the
  // pair's ring).
  __device__ bool Step(int u, uint32_t rank, Item* item, bool* shared_b) {
    const int q = u / col_blocks_, cb = u % col_blocks_;
    Item first, second;
    if (!Find(2 * q, cb, &first)) return false;
    const bool two = Find(2 * q + 1, cb, &second);
    if (!two) second = Item{first.e, first.row0, first.rows, first.m0, first.n0, false};
    *item = rank == 0 ? first : second;
    *shared_b = two && first.e == second.e;
    return true;
  }

 private:
  // Tile `tile`'s item at column block cb, or false past the last tile.
  __device__ bool Find(int tile, int cb, Item* item) {
    while (e_ < num_experts_) {
      const int row0 = offsets_[e_], rows = offsets_[e_ + 1] - row0;
      const int tiles = (rows + kRows - 1) / kRows;
      if (tile < before_ + tiles) {
        *item = Item{e_, row0, rows, (tile - before_) * kRows, cb * kCols, true};
        return true;
      }
      before_ += tiles;
      ++e_;
    }
    return false;
  }

  const int32_t* offsets_;
  int num_experts_, col_blocks_;
  int e_ = 0, before_ = 0;  // the expert reached and the tiles of those before it
};

// Warpgroup wg's 64 rows of an item's outputs (acc in wgmma's layout:
// acc[4 j + e] is column 8 j + 2 (lane % 4) + e % 2 of row r_lo, e < 2, or
// r_hi) into y through shared memory, a round of 128 bytes a row at a time
// (64 bf16 or 32 fp32 columns): the accumulators go into a buffer whose rows'
// 16-byte chunks are swizzled (bf16: stmatrix, an n-tile of 8 columns one
// chunk, chunk ^ (row & 7); fp32: 8-byte stores, chunk ^ 2 (row & 3): the
// rows a half-warp writes together land in distinct banks), then every
// thread copies 16-byte chunks from it to y, a warp four rows of 128
// contiguous bytes at a time (16-byte stores where y's rows are 16-byte
// aligned, else 4- or 8-byte ones). Rows past the expert's and columns past n
// are skipped. Named barrier 1 + wg; a round's buffer is written again only
// once every thread passed the next round's barrier, so two buffers need one
// barrier a round.
template <bool kF32Out>
__device__ __forceinline__ void StoreOut(Smem& s, const float (&acc)[kCols / 2],
                                         const GroupedGemmParams& p, const Item& it, int wg,
                                         bool vec16) {
  constexpr int kElemBytes = kF32Out ? 4 : 2;
  constexpr int kRoundCols = 128 / kElemBytes, kChunkCols = 16 / kElemBytes;
  constexpr int kTilesPerRound = kRoundCols / 8;  // wgmma n-tiles of 8 columns
  const auto swizzle = [](int row) { return kF32Out ? (row & 3) << 1 : row & 7; };
  const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32, g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int r = 0; r < kCols / kRoundCols; ++r) {
    uint8_t* const buf = s.out[wg][r % 2];
    if constexpr (kF32Out) {
#pragma unroll
      for (int i = 0; i < kTilesPerRound; ++i) {
        const int j = r * kTilesPerRound + i;
        const int chunk = 2 * i + tq / 2, within = (tq % 2) * 8;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = warp * 16 + half * 8 + g;
          *reinterpret_cast<float2*>(buf + row * 128 + ((chunk ^ swizzle(row)) << 4) + within) =
              make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
        }
      }
    } else {
      // The row whose address this lane gives stmatrix: matrix lane / 8 is
      // (n-tile 2 i + (lane / 16), rows r_lo or r_hi by (lane / 8) % 2).
      const int srow = warp * 16 + ((lane / 8) % 2) * 8 + lane % 8;
#pragma unroll
      for (int i = 0; i < kTilesPerRound / 2; ++i) {
        const int j = r * kTilesPerRound + 2 * i;  // n-tiles j and j + 1
        const uint32_t frag[4] = {
            PackBf16(acc[4 * j], acc[4 * j + 1]), PackBf16(acc[4 * j + 2], acc[4 * j + 3]),
            PackBf16(acc[4 * j + 4], acc[4 * j + 5]), PackBf16(acc[4 * j + 6], acc[4 * j + 7])};
        const int chunk = 2 * i + lane / 16;
        Stmatrix4(buf + srow * 128 + ((chunk ^ swizzle(srow)) << 4), frag);
      }
    }
    BarSync(1 + wg, 128);
#pragma unroll
    for (int q = t; q < kWgRows * 8; q += 128) {
      const int row = q / 8, chunk = q % 8;
      const int m = it.m0 + wg * kWgRows + row, col = it.n0 + r * kRoundCols + chunk * kChunkCols;
      if (m >= it.rows || col >= p.n) continue;
      const uint4 v =
          *reinterpret_cast<const uint4*>(buf + row * 128 + ((chunk ^ swizzle(row)) << 4));
      uint8_t* const dst = static_cast<uint8_t*>(p.y) +
                           (static_cast<int64_t>(it.row0 + m) * p.ldy + col) * kElemBytes;
      if (vec16) {
        *reinterpret_cast<uint4*>(dst) = v;
      } else if constexpr (kF32Out) {  // ldy and col even: 8-byte aligned
        reinterpret_cast<uint2*>(dst)[0] = make_uint2(v.x, v.y);
        reinterpret_cast<uint2*>(dst)[1] = make_uint2(v.z, v.w);
      } else {  // ldy even: 4-byte aligned
        uint32_t* const d = reinterpret_cast<uint32_t*>(dst);
        d[0] = v.x, d[1] = v.y, d[2] = v.z, d[3] = v.w;
      }
    }
  }
}

// The consumer warpgroups' side of the kernel below: this CTA's item of each
// step, through the ring, into y.
template <bool kF32Out>
__device__ __forceinline__ void Consume(Smem& s, const GroupedGemmParams& p, ItemWalk& walk,
                                        uint32_t rank, uint32_t peer, int first_step, int steps) {
  const int k_tiles = p.k / kSliceK;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wg = tid / 128, g = lane / 4;
  // This thread's two rows of an item (wgmma's accumulator layout).
  const int r_lo = wg * kWgRows + (warp % 4) * 16 + g, r_hi = r_lo + 8;
  const int blocks_n = cpu::Fp8Blocks(p.n);
  const int scale_ld = Fp8ScaleStride(p.k);
  const bool vec16 = p.ldy % (kF32Out ? 4 : 8) == 0 && (reinterpret_cast<uintptr_t>(p.y) & 15) == 0;
  Item it;
  bool shared_b;
  uint32_t slice = 0;
  for (int u = first_step; walk.Step(u, rank, &it, &shared_b); u += steps) {
    // The rows' scale columns; a row past the expert's scales by 0.
    const bool ok_lo = it.m0 + r_lo < it.rows, ok_hi = it.m0 + r_hi < it.rows;
    const float* xs_lo = p.x_scale + (ok_lo ? it.row0 + it.m0 + r_lo : 0);
    const float* xs_hi = p.x_scale + (ok_hi ? it.row0 + it.m0 + r_hi : 0);
    // The item's weight scale rows, one per 128 columns (clamped: a block
    // past n computes columns that are never stored).
    const float* ws_row[kHalves];
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const int nb = min(it.n0 / kHalfCols + h, blocks_n - 1);
      ws_row[h] = p.w_scale + (static_cast<int64_t>(it.e) * blocks_n + nb) * scale_ld;
    }
    float acc[kCols / 2], part[64];
#pragma unroll
    for (int i = 0; i < kCols / 2; ++i) acc[i] = 0.0f;
    // The scales of a slice are loaded a slice ahead, off the promotion's path.
    float ws[kHalves], x_lo = ok_lo ? xs_lo[0] : 0.0f, x_hi = ok_hi ? xs_hi[0] : 0.0f;
#pragma unroll
    for (int h = 0; h < kHalves; ++h) ws[h] = ws_row[h][0];

    for (int kt = 0; kt < k_tiles; ++kt, ++slice) {
      const int stage = slice % kStages;
      float s_lo[kHalves], s_hi[kHalves];
#pragma unroll
      for (int h = 0; h < kHalves; ++h) s_lo[h] = x_lo * ws[h], s_hi[h] = x_hi * ws[h];
      if (kt + 1 < k_tiles) {
        const int64_t at = static_cast<int64_t>(kt + 1) * p.x_scale_ld;
#pragma unroll
        for (int h = 0; h < kHalves; ++h) ws[h] = ws_row[h][kt + 1];
        x_lo = ok_lo ? xs_lo[at] : 0.0f, x_hi = ok_hi ? xs_hi[at] : 0.0f;
      }
      MbarWait(&s.full[stage], (slice / kStages) & 1);
      __syncwarp();  // the wgmma below are warp-synchronous
      const uint8_t* a = s.a[stage] + wg * kBoxBytes;
#pragma unroll
      for (int h = 0; h < kHalves; ++h) {
        const uint8_t* b = s.b[stage] + h * kHalfCols * kSliceK;
        wgmma::FenceOperands(part);
        wgmma::Fence();
        const uint64_t da = wgmma::DescKMajor(a), db = wgmma::DescKMajor(b);
#pragma unroll
        for (int ks = 0; ks < kSliceK / 32; ++ks) {
          wgmma::WgmmaM64N128K32E4m3(part, da + wgmma::DescStep(ks * 32),
                                     db + wgmma::DescStep(ks * 32), ks > 0);
        }
        wgmma::Commit();
        wgmma::Wait<0>();
        wgmma::FenceOperands(part);
        if (h == kHalves - 1) {  // the stage is read: release it, here and in the peer
          __syncwarp();
          if (lane == 0) {
            MbarArrive(&s.empty[stage]);
            MbarArriveCluster(&s.empty[stage], peer);
          }
        }
#pragma unroll
        for (int j = 0; j < 16; ++j) {  // n-tile j: rows r_lo (0, 1) and r_hi (2, 3)
          acc[64 * h + 4 * j] += part[4 * j] * s_lo[h];
          acc[64 * h + 4 * j + 1] += part[4 * j + 1] * s_lo[h];
          acc[64 * h + 4 * j + 2] += part[4 * j + 2] * s_hi[h];
          acc[64 * h + 4 * j + 3] += part[4 * j + 3] * s_hi[h];
        }
      }
    }
    if (it.store) StoreOut<kF32Out>(s, acc, p, it, wg, vec16);
  }
}

template <bool kF32Out>
__global__ void __launch_bounds__(kThreads, 1)
    GroupedGemmFp8WgmmaKernel(const __grid_constant__ Maps maps, GroupedGemmParams p) {
  extern __shared__ uint8_t smem_raw[];
  Smem& s =
      *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int k_tiles = p.k / kSliceK;
  const int col_blocks = (p.n + kCols - 1) / kCols;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint32_t rank = ClusterCtaRank(), peer = rank ^ 1;
  const int first_step = static_cast<int>(ClusterIdX()), steps = static_cast<int>(NumClustersX());
  ItemWalk walk(p.expert_offsets, p.num_experts, col_blocks);

  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) {
      MbarInit(&s.full[st], 1);
      MbarInit(&s.empty[st], 2 * kConsumerWarps);  // both CTAs' consumers release a stage
    }
    FenceMbarInit();
  }
  ClusterSync();  // the peer's copies and arrivals find these barriers made

  if (warp >= kConsumerWarps) {  // the producer warpgroup: one lane works
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if (warp == kConsumerWarps && lane == 0) {
      Item it;
      bool shared_b;
      uint32_t slice = 0;  // slices issued, over all items: the ring's position
      for (int u = first_step; walk.Step(u, rank, &it, &shared_b); u += steps) {
        const int a_y = it.row0 + it.m0, b_y = it.e * p.n + it.n0;
        for (int kt = 0; kt < k_tiles; ++kt, ++slice) {
          const int stage = slice % kStages, x = kt * (kSliceK / 2);  // bf16 columns
          if (slice >= kStages) MbarWait(&s.empty[stage], (slice / kStages - 1) & 1);
          // A's and B's whole slices land here, B's half from the peer where shared.
          MbarArriveExpectTx(&s.full[stage], (kRows + kCols) * kSliceK);
#pragma unroll
          for (int j = 0; j < kRows / 64; ++j) {
            TmaLoad2D(s.a[stage] + j * kBoxBytes, &maps.a, x, a_y + 64 * j, &s.full[stage]);
          }
          if (shared_b) {  // this CTA's two boxes of B, into both CTAs
#pragma unroll
            for (int j = 2 * rank; j < 2 * rank + 2; ++j) {
              TmaLoad2DMulticast(s.b[stage] + j * kBoxBytes, &maps.b, x, b_y + 64 * j,
                                 &s.full[stage], 0x3);
            }
          } else {
#pragma unroll
            for (int j = 0; j < kCols / 64; ++j) {
              TmaLoad2D(s.b[stage] + j * kBoxBytes, &maps.b, x, b_y + 64 * j, &s.full[stage]);
            }
          }
        }
      }
    }
    __syncwarp();
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
    Consume<kF32Out>(s, p, walk, rank, peer, first_step, steps);
  }
  // Neither CTA leaves while its peer may still arrive on its barriers.
  ClusterSync();
}

template <bool kF32Out>
absl::Status LaunchOne(const Maps& maps, const GroupedGemmParams& p) {
  constexpr auto kernel = GroupedGemmFp8WgmmaKernel<kF32Out>;
  RETURN_IF_ERROR(AllowDynamicSmem<kernel>(kSmemBytes));
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute cluster = {};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kClusterCtas;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  config.blockDim = dim3(kThreads);
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = p.stream;
  config.attrs = &cluster;
  config.numAttrs = 1;
  // As many pairs as run at once (the GPCs decide, not SMs / 2), asked once
  // a device (the answer depends on the kernel and the device alone),
  // bounded by the steps: max_tiles bounds the 64-row tiles, and each
  // expert's 128-row tiles are at most its 64-row ones.
  static std::atomic<int> resident_on[64] = {};  // 0: not asked yet on that device
  int device = 0;
  RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  int resident = resident_on[device & 63].load(std::memory_order_relaxed);
  if (resident == 0) {
    config.gridDim = dim3(kClusterCtas);
    RETURN_IF_CUDA_ERROR(cudaOccupancyMaxActiveClusters(&resident, kernel, &config));
    if (resident < 1) {
      return absl::InternalError("GroupedGemmFp8WgmmaKernel: no CTA pair fits an SM pair");
    }
    resident_on[device & 63].store(resident, std::memory_order_relaxed);
  }
  const int64_t steps = (static_cast<int64_t>(p.max_tiles) + 1) / 2 * ((p.n + kCols - 1) / kCols);
  config.gridDim = dim3(kClusterCtas * static_cast<int>(std::min<int64_t>(resident, steps)));
  RETURN_IF_CUDA_ERROR(cudaLaunchKernelEx(&config, kernel, maps, p));
  return LaunchStatus("GroupedGemmFp8WgmmaKernel");
}

}  // namespace

absl::Status LaunchGroupedGemmFp8Wgmma(const GroupedGemmParams& p) {
  if (p.tile_m != kPermutationTile) {
    return absl::InternalError("LaunchGroupedGemmFp8Wgmma: 64-row tiles only");
  }
  Maps maps;
  // Codes as bf16 pairs: cols and strides halve (ldx and k are multiples of 16).
  ASSIGN_OR_RETURN(maps.a, Bf16BoxMap64(p.x_fp8, static_cast<uint64_t>(p.x_scale_ld), p.k / 2,
                                        p.ldx / 2, "x_fp8"));
  ASSIGN_OR_RETURN(maps.b, Bf16BoxMap64(p.w_fp8, static_cast<uint64_t>(p.num_experts) * p.n,
                                        p.k / 2, p.k / 2, "w_fp8"));
  return p.out_type == OutType::kFloat32 ? LaunchOne<true>(maps, p) : LaunchOne<false>(maps, p);
}

}  // namespace moesh::cuda
