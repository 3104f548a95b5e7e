// The FP8 x FP8 grouped GEMM (GroupedGemmParams::x_fp8) at prefill tiles
// (64 rows), on wgmma: one CTA = (64 permuted rows of one expert, 256 output
// columns = two scale row blocks), three warpgroups:
//   * the producer warpgroup (one lane) streams 128-wide k slices (one scale
//     block) into a five-stage ring with 2-D tensor copies, 64-row x
//     128-byte boxes swizzled by the copy engine (SW128; the e4m3 codes read
//     through a bf16 map of half the columns — the copy moves bytes): the
//     slice of A [64 rows, 128] and of B [256 rows, 128], completing on
//     full[stage]; a stage is reused once all eight consumer warps have
//     arrived on empty[stage];
//   * consumer warpgroup w owns output columns [128 w, 128 w + 128) of the
//     CTA (scale row block 2 blockIdx.y + w): four wgmma m64n128k32 e4m3 a
//     slice (A and B K-major in shared memory) into fresh fp32 registers,
//     then promoted into the running sums times x_scale[row, slice] ·
//     w_scale[slice] (Hopper's FP8 wgmma keeps ~13 mantissa bits inside an
//     instruction's sums: no two blocks meet there, as DeepGEMM).
// A's rows past the expert's belong to the next expert (or read as zeros
// past the matrix) and B's past n to the next expert: neither is stored.
// Tiles are found as in grouped_gemm.cu (ExpertOfTile: capturable).
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

constexpr int kRows = 64;     // rows a CTA: the permutation's prefill tile
constexpr int kWgCols = 128;  // output columns a consumer warpgroup
constexpr int kConsumerWgs = 2;
constexpr int kCols = kWgCols * kConsumerWgs;  // 256
constexpr int kSliceK = cpu::kFp8Block;        // 128 codes = 128 bytes: one SW128 row
constexpr int kBoxBytes = 64 * 128;            // one 64-row box
constexpr int kStages = 5;
constexpr int kThreads = 128 * (kConsumerWgs + 1);
constexpr int kConsumerWarps = 4 * kConsumerWgs;
constexpr int kConsumerRegs = 232, kProducerRegs = 40;
// setmaxnreg.inc draws on the CTA's launch allocation: 65536 / 384 threads,
// rounded down to a multiple of 8 = 168 a thread.
static_assert((kConsumerWgs * kConsumerRegs + kProducerRegs) * 128 <=
                  65536 / kThreads / 8 * 8 * kThreads,
              "setmaxnreg would wait forever for registers the CTA does not have");
static_assert(kWgCols == cpu::kFp8Block, "a consumer warpgroup's columns are one scale row block");

struct Smem {
  uint8_t a[kStages][kRows * kSliceK];  // [64 rows, 128 codes], SW128
  uint8_t b[kStages][kCols * kSliceK];  // [256 rows, 128 codes]: four boxes
  alignas(8) uint64_t full[kStages], empty[kStages];
};
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem)) + 1024;  // + 1024-byte alignment
static_assert(kSmemBytes <= 227 * 1024, "over Hopper's shared memory per CTA");

// x_fp8 [x_scale_ld rows, ldx] and w_fp8 [num_experts * n, k] as bf16
// tensors of half the columns, read in 64 x 64 boxes.
struct Maps {
  CUtensorMap a, b;
};

template <bool kF32Out>
__global__ void __launch_bounds__(kThreads, 1)
    GroupedGemmFp8WgmmaKernel(const __grid_constant__ Maps maps, GroupedGemmParams p) {
  extern __shared__ uint8_t smem_raw[];
  Smem& s =
      *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int tile = blockIdx.x;
  if (tile >= p.tile_offsets[p.num_experts]) return;  // uniform per CTA
  const int e = ExpertOfTile(p.tile_offsets, p.num_experts, tile);
  const int row0 = p.expert_offsets[e];
  const int rows = p.expert_offsets[e + 1] - row0;
  const int m0 = (tile - p.tile_offsets[e]) * kRows;
  const int n0 = blockIdx.y * kCols;
  const int k_tiles = p.k / kSliceK;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) {
      MbarInit(&s.full[st], 1);
      MbarInit(&s.empty[st], kConsumerWarps);
    }
    FenceMbarInit();
  }
  __syncthreads();

  if (warp >= kConsumerWarps) {  // the producer warpgroup: one lane works
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kProducerRegs));
    if (warp == kConsumerWarps && lane == 0) {
      const int a_y = row0 + m0, b_y = e * p.n + n0;
      for (int kt = 0; kt < k_tiles; ++kt) {
        const int stage = kt % kStages, x = kt * (kSliceK / 2);  // bf16 columns
        if (kt >= kStages) MbarWait(&s.empty[stage], (kt / kStages - 1) & 1);
        MbarArriveExpectTx(&s.full[stage], (kRows + kCols) * kSliceK);
        TmaLoad2D(s.a[stage], &maps.a, x, a_y, &s.full[stage]);
#pragma unroll
        for (int j = 0; j < kCols / 64; ++j) {
          TmaLoad2D(s.b[stage] + j * kBoxBytes, &maps.b, x, b_y + 64 * j, &s.full[stage]);
        }
      }
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kConsumerRegs));
  const int wg = tid / 128, g = lane / 4, tq = lane % 4;
  // This thread's two rows of the tile (wgmma's accumulator layout) and
  // their scales' columns; a row past the expert's scales by 0.
  const int r_lo = (warp % 4) * 16 + g, r_hi = r_lo + 8;
  const bool ok_lo = m0 + r_lo < rows, ok_hi = m0 + r_hi < rows;
  const float* xs_lo = p.x_scale + (ok_lo ? row0 + m0 + r_lo : 0);
  const float* xs_hi = p.x_scale + (ok_hi ? row0 + m0 + r_hi : 0);
  // This warpgroup's row block of weight scales (clamped: a block past n
  // computes columns that are never stored).
  const int blocks_n = cpu::Fp8Blocks(p.n);
  const int nb = min(blockIdx.y * kConsumerWgs + wg, blocks_n - 1);
  const float* ws_row = p.w_scale + (static_cast<int64_t>(e) * blocks_n + nb) * Fp8ScaleStride(p.k);
  float acc[64], part[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;

  for (int kt = 0; kt < k_tiles; ++kt) {
    const int stage = kt % kStages;
    // The slice's scales, loaded while its operands land.
    const int64_t at = static_cast<int64_t>(kt) * p.x_scale_ld;
    const float ws = ws_row[kt];
    const float s_lo = ok_lo ? xs_lo[at] * ws : 0.0f, s_hi = ok_hi ? xs_hi[at] * ws : 0.0f;
    MbarWait(&s.full[stage], (kt / kStages) & 1);
    __syncwarp();  // the wgmma below are warp-synchronous
    const uint8_t* a = s.a[stage];
    const uint8_t* b = s.b[stage] + wg * kWgCols * kSliceK;
    wgmma::FenceOperands(part);
    wgmma::Fence();
#pragma unroll
    for (int ks = 0; ks < kSliceK / 32; ++ks) {
      wgmma::WgmmaM64N128K32E4m3(part, wgmma::DescKMajor(a + ks * 32),
                                 wgmma::DescKMajor(b + ks * 32), ks > 0);
    }
    wgmma::Commit();
    wgmma::Wait<0>();
    wgmma::FenceOperands(part);
    __syncwarp();
    if (lane == 0) MbarArrive(&s.empty[stage]);
#pragma unroll
    for (int j = 0; j < 16; ++j) {  // n-tile j: rows r_lo (0, 1) and r_hi (2, 3)
      acc[4 * j] += part[4 * j] * s_lo;
      acc[4 * j + 1] += part[4 * j + 1] * s_lo;
      acc[4 * j + 2] += part[4 * j + 2] * s_hi;
      acc[4 * j + 3] += part[4 * j + 3] * s_hi;
    }
  }

#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int col = n0 + wg * kWgCols + 8 * j + 2 * tq;
    if (col >= p.n) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = half ? r_hi : r_lo;
      if (m0 + r >= rows) continue;
      const int64_t off = static_cast<int64_t>(row0 + m0 + r) * p.ldy + col;
      StorePair<kF32Out>(p.y, off, acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
    }
  }
}

template <bool kF32Out>
absl::Status LaunchOne(const Maps& maps, const GroupedGemmParams& p) {
  constexpr auto kernel = GroupedGemmFp8WgmmaKernel<kF32Out>;
  RETURN_IF_ERROR(AllowDynamicSmem<kernel>(kSmemBytes));
  const dim3 grid(p.max_tiles, (p.n + kCols - 1) / kCols);
  kernel<<<grid, kThreads, kSmemBytes, p.stream>>>(maps, p);
  return LaunchStatus("GroupedGemmFp8WgmmaKernel");
}

}  // namespace

absl::Status LaunchGroupedGemmFp8Wgmma(const GroupedGemmParams& p) {
  if (p.tile_m != kRows) {
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
