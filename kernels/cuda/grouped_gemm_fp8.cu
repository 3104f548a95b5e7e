// The grouped expert GEMM in DeepSeek's FP8 end to end (GroupedGemmParams::
// x_fp8): y = dequant(x) · dequant(w)^T with x's e4m3 codes scaled per row
// and 128 columns, w's per 128 x 128 block, on the FP8 tensor cores — no
// widening of the weights (grouped_gemm.cu's FP8 path widens them to bf16
// in registers, a few dependent instructions a register, which is what
// bounds it at decode sizes).
//
// One CTA = (kBM permuted rows of one expert, 128 output columns = one
// scale row block), 4 warps: for 16 or 32 rows four side by side along n
// (32 columns each), for 64 rows 2 x 2 of 32 x 64. The k loop takes
// 128-wide slices (one scale block) through a three-stage cp.async ring,
// each row's 128 codes padded to 144 bytes so every ldmatrix phase hits
// distinct banks. ldmatrix on the codes viewed as b16 pairs gives a thread
// four consecutive k of a row, which is mma.m16n8k32.e4m3's own fragment
// order for A (rows g, g + 8; k 4t.., 16 + 4t..) and for B (weight row g).
// A slice's products are summed in fresh fp32 registers and promoted into
// the running sums times x_scale[row, block] · w_scale[block]: Hopper's FP8
// MMA keeps about 13 mantissa bits in its accumulator, so no two blocks'
// products meet inside it (as DeepGEMM). Tiles are found as in grouped_gemm.cu.
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/grouped_tiles.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"

namespace moesh::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kBN = 128;             // output columns a CTA: one scale row block
constexpr int kBK = cpu::kFp8Block;  // k a slice: one scale block
constexpr int kPitch = kBK + 16;     // bytes a ring row
constexpr int kStages = 3;
constexpr int kChunksPerRow = kBK / 16;  // 16-byte cp.async chunks
static_assert(kBK == 128 && kBN == cpu::kFp8Block);

template <int kBM>
struct Fp8Cfg {
  static constexpr int kWarpsM = kBM == 64 ? 2 : 1;
  static constexpr int kWarpsN = 4 / kWarpsM;
  static constexpr int kWarpM = kBM / kWarpsM;  // 16 or 32 rows a warp
  static constexpr int kWarpN = kBN / kWarpsN;  // 32 or 64 columns a warp
  static constexpr int kMi = kWarpM / 16, kNi = kWarpN / 8;
  static constexpr int kAIters = kBM * kChunksPerRow / kThreads;  // 1, 2 or 4
  static constexpr int kBIters = kBN * kChunksPerRow / kThreads;  // 8
  static constexpr int kSmemBytes = kStages * (kBM + kBN) * kPitch;
  static_assert(kNi % 2 == 0 && kAIters * kThreads == kBM * kChunksPerRow);
};

// 16 or 32 rows: three CTAs an SM (62 or 69 KB each); 64 rows: two.
template <int kBM, bool kF32Out>
__global__ void __launch_bounds__(kThreads, kBM == 64 ? 2 : 3)
    GroupedGemmFp8Kernel(GroupedGemmParams p) {
  using Cfg = Fp8Cfg<kBM>;
  constexpr int kMi = Cfg::kMi, kNi = Cfg::kNi;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  auto sa = reinterpret_cast<uint8_t(*)[kBM][kPitch]>(smem_raw);  // [kStages][kBM][kPitch]
  auto sb = reinterpret_cast<uint8_t(*)[kBN][kPitch]>(smem_raw + kStages * kBM * kPitch);

  const int tile = blockIdx.x;
  if (tile >= p.tile_offsets[p.num_experts]) return;  // uniform per CTA
  const int e = ExpertOfTile(p.tile_offsets, p.num_experts, tile);
  const int row0 = p.expert_offsets[e];
  const int rows = p.expert_offsets[e + 1] - row0;
  const int m0 = (tile - p.tile_offsets[e]) * kBM;
  const int n0 = blockIdx.y * kBN;
  const uint8_t* w8 = p.w_fp8 + static_cast<int64_t>(e) * p.n * p.k;
  // This CTA's row block of weight scales.
  const float* w_scale = p.w_scale + (static_cast<int64_t>(e) * cpu::Fp8Blocks(p.n) + blockIdx.y) *
                                         Fp8ScaleStride(p.k);

  // Thread t copies chunk t % 8 of rows t / 8 + 16 i (i < kAIters of A, < 8
  // of B) each slice; rows past the expert's (A) or past n (B) are zero-filled.
  const int r_first = threadIdx.x / kChunksPerRow, ch = threadIdx.x % kChunksPerRow;
  constexpr int kRowStep = kThreads / kChunksPerRow;  // 16
  const uint8_t* a_base = p.x_fp8 + static_cast<int64_t>(row0 + m0 + r_first) * p.ldx + ch * 16;
  const uint8_t* b_base = w8 + static_cast<int64_t>(n0 + r_first) * p.k + ch * 16;
  auto load = [&](int stage, int kt) {
    const int k0 = kt * kBK;
#pragma unroll
    for (int i = 0; i < Cfg::kAIters; ++i) {
      const int r = r_first + i * kRowStep;
      const bool ok = m0 + r < rows;
      CpAsync16(&sa[stage][r][ch * 16],
                ok ? a_base + static_cast<int64_t>(i) * kRowStep * p.ldx + k0 : p.x_fp8, ok);
    }
#pragma unroll
    for (int i = 0; i < Cfg::kBIters; ++i) {
      const int r = r_first + i * kRowStep;
      const bool ok = n0 + r < p.n;
      CpAsync16(&sb[stage][r][ch * 16],
                ok ? b_base + static_cast<int64_t>(i) * kRowStep * p.k + k0 : p.w_fp8, ok);
    }
  };

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp / Cfg::kWarpsN, wn = warp % Cfg::kWarpsN;
  const int g = lane >> 2;
  // The activation scales of this thread's accumulator rows (g and g + 8 of
  // each 16-row group), this slice's and the next one's; a row past the
  // expert's scales by 0 (its codes are zeros anyway; its sums are never stored).
  const float* xs_row[kMi][2];
  bool xs_ok[kMi][2];
#pragma unroll
  for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m0 + wm * Cfg::kWarpM + mi * 16 + g + half * 8;
      xs_ok[mi][half] = r < rows;
      xs_row[mi][half] = p.x_scale + (xs_ok[mi][half] ? row0 + r : 0);
    }
  }
  float xs_next[kMi][2];
  auto xs_load = [&](int kt) {
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        xs_next[mi][half] =
            xs_ok[mi][half] ? xs_row[mi][half][static_cast<int64_t>(kt) * p.x_scale_ld] : 0.0f;
      }
    }
  };

  float acc[kMi][kNi][4];
#pragma unroll
  for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
    for (int ni = 0; ni < kNi; ++ni) {
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[mi][ni][v] = 0.0f;
    }
  }

  const int k_tiles = p.k / kBK;
  float ws_next = w_scale[0];
  xs_load(0);
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load(s, s);
    CpAsyncCommit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // slice kt landed for everyone; slice kt - 1's stage is free
    const int next = kt + kStages - 1;
    if (next < k_tiles) load(next % kStages, next);
    CpAsyncCommit();
    const int st = kt % kStages;
    // This slice's scales; the next slice's on their way.
    float scale[kMi][2];
    const float ws = ws_next;
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi) {
      scale[mi][0] = xs_next[mi][0] * ws;
      scale[mi][1] = xs_next[mi][1] * ws;
    }
    if (kt + 1 < k_tiles) {
      ws_next = w_scale[kt + 1];
      xs_load(kt + 1);
    }
    float part[kMi][kNi][4];
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni) {
#pragma unroll
        for (int v = 0; v < 4; ++v) part[mi][ni][v] = 0.0f;
      }
    }
#pragma unroll
    for (int ks = 0; ks < kBK / 32; ++ks) {
      // A: matrices (rows 0-7 | 8-15) x (k bytes 0-15 | 16-31) -> a0 a1 a2 a3.
      uint32_t a[kMi][4];
#pragma unroll
      for (int mi = 0; mi < kMi; ++mi) {
        Ldmatrix4(a[mi],
                  &sa[st][wm * Cfg::kWarpM + mi * 16 + (lane & 15)][ks * 32 + (lane >> 4) * 16]);
      }
#pragma unroll
      for (int nj = 0; nj < kNi / 2; ++nj) {
        // B: (n 0-7, k 0-15), (n 0-7, k 16-31), (n 8-15, k 0-15), (n 8-15, k 16-31).
        uint32_t b[4];
        Ldmatrix4(b, &sb[st][wn * Cfg::kWarpN + nj * 16 + (lane & 7) + (lane >> 4) * 8]
                        [ks * 32 + ((lane >> 3) & 1) * 16]);
#pragma unroll
        for (int mi = 0; mi < kMi; ++mi) {
          MmaE4m3(part[mi][2 * nj], a[mi], b[0], b[1]);
          MmaE4m3(part[mi][2 * nj + 1], a[mi], b[2], b[3]);
        }
      }
    }
#pragma unroll
    for (int mi = 0; mi < kMi; ++mi) {
#pragma unroll
      for (int ni = 0; ni < kNi; ++ni) {
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[mi][ni][v] += part[mi][ni][v] * scale[mi][v >> 1];
      }
    }
  }
  CpAsyncWait<0>();

  StoreWarpTile<kF32Out>(acc, p.y, p.ldy, p.n, row0, rows, m0 + wm * Cfg::kWarpM,
                         n0 + wn * Cfg::kWarpN, lane);
}

template <int kBM, bool kF32Out>
absl::Status LaunchOne(const GroupedGemmParams& p) {
  constexpr auto kernel = GroupedGemmFp8Kernel<kBM, kF32Out>;
  constexpr int kSmem = Fp8Cfg<kBM>::kSmemBytes;
  RETURN_IF_ERROR(AllowDynamicSmem<kernel>(kSmem));
  const dim3 grid(p.max_tiles, (p.n + kBN - 1) / kBN);
  kernel<<<grid, kThreads, kSmem, p.stream>>>(p);
  return LaunchStatus("GroupedGemmFp8Kernel");
}

template <int kBM>
absl::Status Launch(const GroupedGemmParams& p) {
  return p.out_type == OutType::kFloat32 ? LaunchOne<kBM, true>(p) : LaunchOne<kBM, false>(p);
}

}  // namespace

absl::Status LaunchGroupedGemmFp8(const GroupedGemmParams& p) {
  switch (p.tile_m) {
    case 16:
      return Launch<16>(p);
    case 32:
      return Launch<32>(p);
    default:
      return p.x_fp8_mma_sync ? Launch<64>(p) : LaunchGroupedGemmFp8Wgmma(p);
  }
}

}  // namespace moesh::cuda
