// Grouped GEMM over a layer's experts (GroupedGemmParams in model_params.h).
//
// One CTA = (tile of kBM permuted rows of one expert, 128 output columns), 4
// warps, mma.m16n8k16 (bf16 in, fp32 accumulate) fed by ldmatrix from a
// cp.async ring of kBK-wide k slices (64: 128 contiguous bytes of each weight
// row per slice; 32 where k is not a multiple of 64). The expert of a tile is found by binary
// search over the device-side tile offsets, so the grid is a host bound
// (GroupedGemmMaxTiles) and CTAs past the real tile count return at once:
// no host sync, capturable in a CUDA graph. Tiles of one expert are adjacent
// in launch order, so its weight slice is read from DRAM about once.
//
// FP8 weights (w_fp8): the ring holds each slice's e4m3 bytes (128-wide
// slices where k allows; rows padded by 16 bytes so a warp's fragment reads
// hit distinct banks), and each warp widens its B fragments in registers
// (times the 128 x 128 block's scale: the CTA's 128 columns are one row
// block), in place of ldmatrix.
//
// MXFP4 weights (w_fp4, DeepSeek-V4's routed experts): the ring holds e2m1
// pairs (kBK / 2 bytes a row and slice; 256- or 128-wide slices on decode
// tiles where k allows, else 64), each warp widens its B fragments from one
// 32-bit load a 32-input group (WidenMxfp4: the MMAs take the inputs in
// Mxfp4MmaInput's order, A read alike), times the ue8m0 scale of the group,
// which each thread reads for its rows one slice ahead into registers.
// Hopper has no FP4 MMA: the weights stream at 4 bits, the MMA is bf16's,
// and the result is the bf16 kernel's on the dequantized weights summed in
// that order.
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <type_traits>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/grouped_gemm_fp8.h"
#include "kernels/cuda/grouped_tiles.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/params.h"
#include "kernels/cuda/pdl.cuh"

namespace moesh::cuda {
namespace {

constexpr int kBN = 128;

// kBM 16 and 32: four warps side by side along n (each all kBM rows × 32
// columns); 64: 2 × 2 warps of 32 × 64. Rows of kBK + 8 elements (80 or 144
// bytes) keep ldmatrix conflict-free. Two CTAs fit an SM with 64-wide slices.
// kDeep (FP8 weights, decode tiles, 128-wide slices): a launch whose tiles
// fit one CTA an SM (batch 1: six experts' tiles) runs six stages, so each CTA
// streams 80 KB ahead instead of the 16 KB two stages keep in flight (four
// CTAs an SM share the copy rate there), in eight warps of 16 columns (two a
// scheduler to hide the widening's chains: 19.7 -> 19.2 us a launch at
// V2-Lite FP8 batch 1 under ncu, H100).
template <int kBM, int kBK, bool kDeep = false>
struct GemmCfg {
  static constexpr int kStages = kBK == 32 ? (kBM == 16 ? 4 : 3) : (kBM == 64 ? 3 : 4);
  static constexpr int kPitch = kBK + 8;
  static constexpr int kThreads = kDeep ? 256 : 128;
  static constexpr int kWarpsM = kBM == 64 ? 2 : 1;
  // Experiment (MOESH_EXP_MXFP4_KSPLIT, issue 17): kDeep at 256 wide (MXFP4)
  // splits each slice's k between two groups of four warps, which sum their
  // accumulators at the end.
  static constexpr int kWarpsK = kDeep && kBK == 256 ? 2 : 1;
  static constexpr int kWarpsN = kThreads / 32 / kWarpsM / kWarpsK;
  static constexpr int kWarpM = kBM / kWarpsM;  // 16 or 32 rows per warp
  static constexpr int kWarpN = kBN / kWarpsN;  // 32 or 64 columns per warp
  static constexpr int kMi = kWarpM / 16, kNi = kWarpN / 8;
  static constexpr int kChunksPerRow = kBK / 8;  // 16-byte chunks
  static constexpr int kAChunks = kBM * kChunksPerRow;
  static constexpr int kBChunks = kBN * kChunksPerRow;
  static constexpr int kSmemBytes = kStages * (kBM + kBN) * kPitch * 2;
  // FP8 weights: A's ring and the e4m3 ring (rows of kF8Pitch bytes). Their
  // slices are 128 wide (a whole scale block; as many weight bytes a stage as
  // bf16's 64), else two stages deeper. The widening makes a slice's B
  // operand a chain of a few dependent instructions a register, which two
  // warps a scheduler cannot hide: decode-sized tiles (16 or 32 rows) take
  // two stages of 128, so four CTAs (16 warps) fit an SM, each with the next
  // slice in flight while it computes this one (64 KB an SM in flight, past
  // what the copy rate needs); 64-row (prefill) tiles keep kStages.
  static constexpr int kF8Chunks = kBN * kBK / 16;
  static constexpr int kF8Pitch = kBK + 16;
  static constexpr int kF8Stages =
      kBK == 128 ? (kBM == 64 ? kStages : (kDeep ? 6 : 2)) : kStages + 2;
  static_assert(!kDeep || (kBK >= 128 && kBM < 64), "deep rings are for decode tiles");
  static constexpr int kF8SmemBytes = kF8Stages * (kBM * kPitch * 2 + kBN * kF8Pitch);
  // MXFP4 weights: the e2m1 ring (rows padded to 48, 80 or 144 bytes: a
  // warp's 32-bit loads of eight rows fall in distinct banks), two stages
  // deeper at 32 and 64 wide, four at 128 (60 KB for 16 rows: three CTAs an
  // SM), four or three at 256 (108 KB: two CTAs an SM). 256 wide is 128
  // contiguous bytes of each weight row a slice: the grouped GEMMs streamed
  // ~1.9 TB/s of an H100's 3.0 whenever a slice held 64 bytes of a row (bf16
  // at 32 wide, FP8 at 64, MXFP4 at 128) and ~2.8 at 128 bytes (bf16 at 64,
  // FP8 at 128), whatever the widening cost. A's rows are read 16 bytes a
  // thread (Mxfp4A's k order, below), so their pitch is 64 bytes past a
  // multiple of 128: a quarter-warp's two rows miss each other.
  static constexpr int kF4Chunks = kBN * kBK / 32;
  static constexpr int kF4Pitch = kBK == 32 ? 48 : kBK / 2 + 16;
  static constexpr int kF4APitch = kBK == 32 ? kBK : kBK + 32;
  static constexpr int kF4Stages =
      kBK == 256 ? (kBM == 16 ? 4 : 3) : (kBK == 128 ? 4 : kStages + 2);
  static constexpr int kF4SmemBytes = kF4Stages * (kBM * kF4APitch * 2 + kBN * kF4Pitch);
  static_assert(kNi % 2 == 0 && kBChunks % kThreads == 0 && kF8Chunks % kThreads == 0 &&
                kF4Chunks % kThreads == 0);
};

// The formats of B (the weights).
enum class WeightKind { kBf16, kFp8, kFp4 };

// Two e4m3 codes (the lower k first) times `scale`, rounded to a bf16 pair:
// an MMA B register.
__device__ __forceinline__ uint32_t WidenFp8x2(const uint8_t* codes, float scale) {
  const __nv_fp8x2_storage_t pair = *reinterpret_cast<const __nv_fp8x2_storage_t*>(codes);
  const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
  const __nv_bfloat162 v = __floats2bfloat162_rn(f.x * scale, f.y * scale);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// MXFP4's widening. A thread's B operand for one 32-input group of a weight
// row is 4 bytes of the row's 16 (at 4 t, t = lane % 4): the codes of inputs
// 8 t .. 8 t + 7, one 32-bit shared load. The MMAs take them in the order
// Mxfp4MmaInput (model_ops.h) names, in which each B register holds two
// nibbles 16 bits apart: register j (the group's first MMA's b0, b1, then
// the second's) holds nibbles j and j + 4, i.e. inputs 8 t + j and 8 t + j +
// 4. A is read in the same order (Mxfp4A). Each register then costs a mask,
// a multiply and a mask, and one bf16x2 multiply by the scale:
//  * an e2m1 code's exponent and mantissa bits placed as bf16's low exponent
//    bits and top mantissa bit give the code's value times 2^-126, exactly —
//    exponent 0 lands in bf16's subnormals, which hold e2m1's 0 and 0.5 so
//    (the multiply by 2^6 + 2^12 puts the nibble's magnitude at bits 6-8 and
//    its sign at 15 in one step: the two copies do not overlap);
//  * times 2^(e - 1) for the ue8m0 scale 2^(e - 127) when e <= 128 (a bf16:
//    exact, a power of two); a larger scale (or the NaN one, 0xFF) takes two
//    multiplies, 2^126 then the scale, on a warp-uniform path of its own.
// So the result is the dequantized value kernels/cpu/mxfp4.h computes, as a
// bf16, whichever path ran.
template <int kJ>
__device__ __forceinline__ uint32_t Mxfp4Bits(uint32_t w) {
  const uint32_t x = (kJ < 2 ? w : w >> 8) & (kJ % 2 == 0 ? 0x000F000Fu : 0x00F000F0u);
  return (x * (kJ % 2 == 0 ? 0x1040u : 0x104u)) & 0x81C081C0u;
}

// 2^(e - 1) in both bf16 halves: the one factor of a scale e <= 128.
__device__ __forceinline__ uint32_t Mxfp4Factor(uint32_t e) { return ((e + 126u) << 7) * 0x10001u; }

// Half `half` of a bf16 pair in both halves (an operand swizzle of HMUL2).
__device__ __forceinline__ uint32_t Broadcast(uint32_t pair, int half) {
  const __nv_bfloat162 p = *reinterpret_cast<const __nv_bfloat162*>(&pair);
  const __nv_bfloat162 v = half == 0 ? __low2bfloat162(p) : __high2bfloat162(p);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// A ue8m0 scale as a pair of bf16s (the two-multiply path).
__device__ __forceinline__ uint32_t E8M0Pair(uint32_t e) {
  const uint32_t h = e == 0xFFu ? 0x7FC0u : (e == 0 ? 0x0040u : e << 7);
  return h | (h << 16);
}

__device__ __forceinline__ uint32_t HMul2(uint32_t a, uint32_t b) {
  const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&b));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Register kJ of a group's B operand from its 32-bit word `w`: one factor, or
// (kBig) 2^126 then the scale pair `f2`.
template <int kJ, bool kBig>
__device__ __forceinline__ uint32_t WidenMxfp4(uint32_t w, uint32_t f1, uint32_t f2) {
  const uint32_t v = HMul2(Mxfp4Bits<kJ>(w), f1);
  return kBig ? HMul2(v, f2) : v;
}

// A's fragments for one 32-input group in Mxfp4MmaInput's order: q0 and q1
// are rows g and g + 8's inputs 8 t .. 8 t + 7 (16 bytes each); a[h] is the
// group's MMA h's A operand.
__device__ __forceinline__ void Mxfp4A(const uint4& q0, const uint4& q1, uint32_t (&a)[2][4]) {
  a[0][0] = __byte_perm(q0.x, q0.z, 0x5410), a[0][1] = __byte_perm(q1.x, q1.z, 0x5410);
  a[0][2] = __byte_perm(q0.x, q0.z, 0x7632), a[0][3] = __byte_perm(q1.x, q1.z, 0x7632);
  a[1][0] = __byte_perm(q0.y, q0.w, 0x5410), a[1][1] = __byte_perm(q1.y, q1.w, 0x5410);
  a[1][2] = __byte_perm(q0.y, q0.w, 0x7632), a[1][3] = __byte_perm(q1.y, q1.w, 0x7632);
}

// FP8 decode tiles: four CTAs an SM (GemmCfg::kF8Stages), so at most 128
// registers a thread; one with kDeep.
template <int kBM, int kBK, bool kF32Out, WeightKind kW, bool kDeep = false>
__global__ void __launch_bounds__(GemmCfg<kBM, kBK, kDeep>::kThreads,
                                  kW == WeightKind::kFp8 && kBM < 64 && kBK == 128 && !kDeep ? 4
                                  : kW == WeightKind::kFp4 && kDeep                          ? 2
                                                                                             : 1)
    GroupedGemmKernel(GroupedGemmParams p) {
  PdlBegin();
  using Cfg = GemmCfg<kBM, kBK, kDeep>;
  constexpr int kThreads = Cfg::kThreads;
  constexpr bool kFp8W = kW == WeightKind::kFp8, kFp4W = kW == WeightKind::kFp4;
  constexpr int S = kFp8W ? Cfg::kF8Stages : (kFp4W ? Cfg::kF4Stages : Cfg::kStages),
                kPitch = Cfg::kPitch, kAPitch = kFp4W ? Cfg::kF4APitch : kPitch;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  auto sa = reinterpret_cast<bf16(*)[kBM][kAPitch]>(smem_raw);  // [S][kBM][kAPitch]
  // bf16 weights: [S][kBN][kPitch]. FP8: the e4m3 ring [S][kBN][kF8Pitch].
  uint8_t* const sw = smem_raw + S * kBM * kAPitch * 2;
  auto sb = reinterpret_cast<bf16(*)[kBN][kPitch]>(sw);
  auto s8 = reinterpret_cast<uint8_t(*)[kBN][Cfg::kF8Pitch]>(sw);
  auto s4 = reinterpret_cast<uint8_t(*)[kBN][Cfg::kF4Pitch]>(sw);

  const int tile = blockIdx.x;
  if (tile >= p.tile_offsets[p.num_experts]) return;  // uniform per CTA
  const int e = ExpertOfTile(p.tile_offsets, p.num_experts, tile);
  const int row0 = p.expert_offsets[e];
  const int rows = p.expert_offsets[e + 1] - row0;
  const int m0 = (tile - p.tile_offsets[e]) * kBM;
  const int n0 = blockIdx.y * kBN;
  const bf16* w = kW == WeightKind::kBf16 ? p.w + static_cast<int64_t>(e) * p.n * p.k : nullptr;
  const uint8_t* w8 = kFp8W   ? p.w_fp8 + static_cast<int64_t>(e) * p.n * p.k
                      : kFp4W ? p.w_fp4 + static_cast<int64_t>(e) * p.n * (p.k / 2)
                              : nullptr;
  // This CTA's row block of scales (kBN == the block: one row block per CTA).
  const float* w_scale =
      kFp8W ? p.w_scale +
                  (static_cast<int64_t>(e) * cpu::Fp8Blocks(p.n) + blockIdx.y) * Fp8ScaleStride(p.k)
            : nullptr;

  // Each thread's A chunks (fixed rows across k) and B chunks.
  constexpr int kAIters = (Cfg::kAChunks + kThreads - 1) / kThreads;
  const bf16* a_src[kAIters];
  bool a_ok[kAIters];
#pragma unroll
  for (int i = 0; i < kAIters; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int r = c / Cfg::kChunksPerRow, ch = c % Cfg::kChunksPerRow;
    a_ok[i] = c < Cfg::kAChunks && m0 + r < rows;
    int64_t src_row = 0;
    if (a_ok[i]) src_row = p.row_index != nullptr ? p.row_index[row0 + m0 + r] : row0 + m0 + r;
    a_src[i] = p.x + src_row * p.ldx + ch * 8;
  }
  // B's chunks: 8 bf16, 16 e4m3 or 32 e2m1 values each.
  constexpr int kBIters =
      (kFp8W ? Cfg::kF8Chunks : (kFp4W ? Cfg::kF4Chunks : Cfg::kBChunks)) / kThreads;
  constexpr int kBChunksPerRow = kFp8W ? kBK / 16 : (kFp4W ? kBK / 32 : Cfg::kChunksPerRow);
  const int64_t w_row_bytes = kFp4W ? p.k / 2 : p.k;
  const uint8_t* b_src[kBIters];
  bool b_ok[kBIters];
#pragma unroll
  for (int i = 0; i < kBIters; ++i) {
    const int c = threadIdx.x + i * kThreads;
    const int r = c / kBChunksPerRow, ch = c % kBChunksPerRow;
    b_ok[i] = n0 + r < p.n;
    const int64_t row = b_ok[i] ? n0 + r : 0;
    b_src[i] = kW != WeightKind::kBf16 ? w8 + row * w_row_bytes + ch * 16
                                       : reinterpret_cast<const uint8_t*>(w + row * p.k + ch * 8);
  }
  auto load = [&](int stage, int kt) {
    const int k0 = kt * kBK;
#pragma unroll
    for (int i = 0; i < kAIters; ++i) {
      const int c = threadIdx.x + i * kThreads;
      if (c < Cfg::kAChunks) {
        CpAsync16(&sa[stage][c / Cfg::kChunksPerRow][(c % Cfg::kChunksPerRow) * 8],
                  a_ok[i] ? a_src[i] + k0 : p.x, a_ok[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kBIters; ++i) {
      const int c = threadIdx.x + i * kThreads;
      if constexpr (kFp8W) {
        CpAsync16(&s8[stage][c / kBChunksPerRow][(c % kBChunksPerRow) * 16],
                  b_ok[i] ? b_src[i] + k0 : p.w_fp8, b_ok[i]);
      } else if constexpr (kFp4W) {
        CpAsync16(&s4[stage][c / kBChunksPerRow][(c % kBChunksPerRow) * 16],
                  b_ok[i] ? b_src[i] + k0 / 2 : p.w_fp4, b_ok[i]);
      } else {
        CpAsync16(&sb[stage][c / Cfg::kChunksPerRow][(c % Cfg::kChunksPerRow) * 8],
                  b_ok[i] ? b_src[i] + k0 * 2 : reinterpret_cast<const uint8_t*>(p.w), b_ok[i]);
      }
    }
  };

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kWarpsMN = Cfg::kWarpsM * Cfg::kWarpsN;
  const int wm = (Cfg::kWarpsK == 1 ? warp : warp % kWarpsMN) / Cfg::kWarpsN;
  const int wn = warp % Cfg::kWarpsN;
  const int wk = Cfg::kWarpsK == 1 ? 0 : warp / kWarpsMN;  // this warp's k part of a slice
  // MXFP4: this thread's B rows (n and n + 8 of each 16-column group) and
  // their ue8m0 scales, the current slice's and the next one's, kBK / 32
  // bytes a row packed in a word (few registers: the 64-row tile has none to
  // spare).
  constexpr int kRows = kFp4W ? Cfg::kNi : 1, kGroups = kFp4W ? kBK / 32 / Cfg::kWarpsK : 1;
  const int64_t groups_per_row = p.k / 32;
  const uint8_t* mx_expert = nullptr;  // this expert's scale rows
  const int n_thread = n0 + wn * Cfg::kWarpN + (lane >> 2);
  // Row j's scales (a row past n reads the last row's: its outputs are never stored).
  auto mx_row = [&](int j) {
    const int n = n_thread + (j / 2) * 16 + (j % 2) * 8;
    return mx_expert + static_cast<int64_t>(n < p.n ? n : p.n - 1) * groups_per_row;
  };
  // One load a row and slice: a row's kGroups bytes are aligned to their
  // size (k / 32 bytes a row, a multiple of kGroups; RunGroupedGemm wants the
  // scales 8-byte aligned).
  using MxWord = std::conditional_t<kGroups == 8, uint64_t, uint32_t>;
  auto mx_load = [&](int j, int kt) -> MxWord {
    const uint8_t* at = mx_row(j) + (kt * Cfg::kWarpsK + wk) * kGroups;
    if constexpr (kGroups == 8) return *reinterpret_cast<const uint64_t*>(at);
    if constexpr (kGroups == 4) return *reinterpret_cast<const uint32_t*>(at);
    if constexpr (kGroups == 2) return *reinterpret_cast<const uint16_t*>(at);
    return *at;
  };
  MxWord mx[kRows], mx_next[kRows];
  if constexpr (kFp4W) {
    mx_expert = p.w_mx_scale + static_cast<int64_t>(e) * p.n * groups_per_row;
#pragma unroll
    for (int j = 0; j < kRows; ++j) mx_next[j] = mx_load(j, 0);
  }

  float acc[Cfg::kMi][Cfg::kNi][4];
#pragma unroll
  for (int i = 0; i < Cfg::kMi; ++i) {
#pragma unroll
    for (int j = 0; j < Cfg::kNi; ++j) {
#pragma unroll
      for (int v = 0; v < 4; ++v) acc[i][j][v] = 0.0f;
    }
  }

  const int k_tiles = p.k / kBK;
  float scale_next = kFp8W ? w_scale[0] : 0.0f;
#pragma unroll
  for (int s = 0; s < S - 1; ++s) {
    if (s < k_tiles) load(s, s);
    CpAsyncCommit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    CpAsyncWait<S - 2>();
    __syncthreads();  // slice kt landed for everyone; slice kt - 1's stage is free
    const int next = kt + S - 1;
    if (next < k_tiles) load(next % S, next);
    CpAsyncCommit();
    const int st = kt % S;
    // FP8: this slice's block scale, the next one's on its way (a load the
    // widening would otherwise wait for each slice).
    const float scale = scale_next;
    if (kFp8W && kt + 1 < k_tiles) scale_next = w_scale[(kt + 1) * kBK / cpu::kFp8Block];
    if constexpr (kFp4W) {  // this slice's scales; the next slice's on their way
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        mx[j] = mx_next[j];
        if (kt + 1 < k_tiles) mx_next[j] = mx_load(j, kt + 1);
      }
    }
    if constexpr (kFp4W) {
      // Any scale of the warp's rows at or past 2^1 this slice (a byte's top
      // bit): the two-multiply widening.
      uint32_t any = 0;
#pragma unroll
      for (int j = 0; j < kRows; ++j) {
        any |= static_cast<uint32_t>(mx[j]);
        if constexpr (kGroups == 8) any |= static_cast<uint32_t>(mx[j] >> 32);
      }
      const bool big = (any & 0x80808080u) != 0;
      auto slice = [&](auto big_tag) {
        constexpr bool kBig = decltype(big_tag)::value;
        const int t4 = lane & 3;
        // The one-multiply path's factors 2^(e - 1) (Mxfp4Factor, e <= 127
        // here), a bf16 a group, made for all groups at once (a byte's e +
        // 126 does not carry): each 4-byte word of scales gives two bf16
        // pairs, groups 0 | 2 and 1 | 3 of its four (so group gi is half
        // (gi >> 1) & 1 of register (gi >> 2) * 2 + (gi & 1)); fewer than
        // four groups, one pair.
        constexpr int kFRegs = kGroups >= 4 ? kGroups / 2 : 1;
        uint32_t f[kRows][kFRegs];
        if constexpr (!kBig) {
#pragma unroll
          for (int j = 0; j < kRows; ++j) {
            if constexpr (kGroups >= 4) {
#pragma unroll
              for (int w = 0; w < kGroups / 4; ++w) {
                const uint32_t b = static_cast<uint32_t>(mx[j] >> (32 * w)) + 0x7E7E7E7Eu;
                f[j][2 * w] = (b & 0x00FF00FFu) << 7, f[j][2 * w + 1] = (b >> 1) & 0x7F807F80u;
              }
            } else {
              const uint32_t b = static_cast<uint32_t>(mx[j]) + 0x7E7E7E7Eu;
              f[j][0] = ((b & 0xFFu) << 7) | ((b & 0xFF00u) << 15);
            }
          }
        }
#pragma unroll
        for (int gi = 0; gi < kGroups; ++gi) {
          const int gk = wk * kGroups + gi;  // the group's place in the slice
          uint32_t a[Cfg::kMi][2][4];
#pragma unroll
          for (int mi = 0; mi < Cfg::kMi; ++mi) {
            const int r = wm * Cfg::kWarpM + mi * 16 + (lane >> 2);
            Mxfp4A(*reinterpret_cast<const uint4*>(&sa[st][r][gk * 32 + 8 * t4]),
                   *reinterpret_cast<const uint4*>(&sa[st][r + 8][gk * 32 + 8 * t4]), a[mi]);
          }
#pragma unroll
          for (int ni = 0; ni < Cfg::kNi; ++ni) {  // row n and n + 8 of each 16 as mx_row
            const int n = wn * Cfg::kWarpN + (ni / 2) * 16 + (ni % 2) * 8 + (lane >> 2);
            const uint32_t w = *reinterpret_cast<const uint32_t*>(&s4[st][n][gk * 16 + 4 * t4]);
            uint32_t f1, f2 = 0;
            if constexpr (kBig) {
              const uint32_t e = static_cast<uint32_t>(mx[ni] >> (8 * gi)) & 0xFFu;
              f1 = e <= 128u ? Mxfp4Factor(e) : 0x7E807E80u;
              f2 = e <= 128u ? 0x3F803F80u : E8M0Pair(e);
            } else if constexpr (kGroups >= 4) {
              f1 = Broadcast(f[ni][(gi >> 2) * 2 + (gi & 1)], (gi >> 1) & 1);
            } else {
              f1 = Broadcast(f[ni][0], gi);
            }
            const uint32_t b0 = WidenMxfp4<0, kBig>(w, f1, f2), b1 = WidenMxfp4<1, kBig>(w, f1, f2);
            const uint32_t b2 = WidenMxfp4<2, kBig>(w, f1, f2), b3 = WidenMxfp4<3, kBig>(w, f1, f2);
#pragma unroll
            for (int mi = 0; mi < Cfg::kMi; ++mi) {
              Mma(acc[mi][ni], a[mi][0], b0, b1);
              Mma(acc[mi][ni], a[mi][1], b2, b3);
            }
          }
        }
      };
      if (__any_sync(0xFFFFFFFFu, big)) {
        slice(std::true_type{});
      } else {
        slice(std::false_type{});
      }
      continue;
    }
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t a[Cfg::kMi][4];
#pragma unroll
      for (int mi = 0; mi < Cfg::kMi; ++mi) {
        Ldmatrix4(a[mi],
                  &sa[st][wm * Cfg::kWarpM + mi * 16 + (lane & 15)][ks * 16 + (lane >> 4) * 8]);
      }
#pragma unroll
      for (int nj = 0; nj < Cfg::kNi / 2; ++nj) {
        uint32_t b[4];
        if constexpr (kFp8W) {  // ldmatrix's four 8 x 8 matrices: n 0-7 | 8-15 by k 0-7 | 8-15
          const int n = wn * Cfg::kWarpN + nj * 16 + (lane >> 2), k = ks * 16 + 2 * (lane & 3);
          b[0] = WidenFp8x2(&s8[st][n][k], scale);
          b[1] = WidenFp8x2(&s8[st][n][k + 8], scale);
          b[2] = WidenFp8x2(&s8[st][n + 8][k], scale);
          b[3] = WidenFp8x2(&s8[st][n + 8][k + 8], scale);
        } else {
          Ldmatrix4(b, &sb[st][wn * Cfg::kWarpN + nj * 16 + (lane & 7) + (lane >> 4) * 8]
                          [ks * 16 + ((lane >> 3) & 1) * 8]);
        }
#pragma unroll
        for (int mi = 0; mi < Cfg::kMi; ++mi) {
          Mma(acc[mi][2 * nj], a[mi], b[0], b[1]);
          Mma(acc[mi][2 * nj + 1], a[mi], b[2], b[3]);
        }
      }
    }
  }
  CpAsyncWait<0>();
  if constexpr (Cfg::kWarpsK == 2) {  // the second k part's sums join the first's
    constexpr int kAcc = Cfg::kMi * Cfg::kNi * 4;
    float* part = reinterpret_cast<float*>(smem_raw) + (wn * 32 + lane) * kAcc;
    __syncthreads();  // every warp is past its last slice: the ring is free
    if (wk == 1) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) part[i] = (&acc[0][0][0])[i];
    }
    __syncthreads();
    if (wk == 1) return;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) (&acc[0][0][0])[i] += part[i];
  }
  StoreWarpTile<kF32Out>(acc, p.y, p.ldy, p.n, row0, rows, m0 + wm * Cfg::kWarpM,
                         n0 + wn * Cfg::kWarpN, lane);
}

template <int kBM, int kBK, bool kF32Out, WeightKind kW, bool kDeep = false>
absl::Status LaunchOne(const GroupedGemmParams& p) {
  constexpr auto kernel = GroupedGemmKernel<kBM, kBK, kF32Out, kW, kDeep>;
  using Cfg = GemmCfg<kBM, kBK, kDeep>;
  constexpr int kSmem = kW == WeightKind::kFp8   ? Cfg::kF8SmemBytes
                        : kW == WeightKind::kFp4 ? Cfg::kF4SmemBytes
                                                 : Cfg::kSmemBytes;
  RETURN_IF_ERROR(AllowDynamicSmem<kernel>(kSmem));
  const dim3 grid(p.max_tiles, (p.n + kBN - 1) / kBN);
  return LaunchPdl("GroupedGemmKernel", kernel, grid, Cfg::kThreads, kSmem, p.stream, p);
}

template <int kBM, int kBK>
absl::Status Launch(const GroupedGemmParams& p) {
  const bool f32 = p.out_type == OutType::kFloat32;
  if (p.w_fp8 != nullptr) {
    if constexpr (kBK == 256) {
      return absl::InternalError("GroupedGemm: 256-wide slices are for MXFP4 decode tiles");
    } else {  // nested, so that no FP8 kernel is instantiated at 256 wide
      if constexpr (kBK == 128 && kBM < 64) {
        // kDeep where the grid fits one CTA an SM (a second wave costs more
        // than the deeper ring buys: at batch 2 it did, 4.21 -> 4.33 ms a
        // V2-Lite step); max_tiles bounds the tiles from above by one at
        // least (GroupedGemmMaxTiles).
        ASSIGN_OR_RETURN(const DeviceInfo device, CurrentDeviceInfo());
        if (int64_t{p.max_tiles - 1} * ((p.n + kBN - 1) / kBN) <= device.num_sms) {
          return f32 ? LaunchOne<kBM, kBK, true, WeightKind::kFp8, true>(p)
                     : LaunchOne<kBM, kBK, false, WeightKind::kFp8, true>(p);
        }
      }
      return f32 ? LaunchOne<kBM, kBK, true, WeightKind::kFp8>(p)
                 : LaunchOne<kBM, kBK, false, WeightKind::kFp8>(p);
    }
  }
  if (p.w_fp4 != nullptr) {
    if constexpr (kBK >= 128 && kBM == 64) {
      return absl::InternalError(
          "GroupedGemm: MXFP4 takes 128- and 256-wide slices on decode tiles only");
    } else {
      if constexpr (kBK == 256 && kBM == 16) {
        static const bool ksplit = std::getenv("MOESH_EXP_MXFP4_KSPLIT") != nullptr;
        if (ksplit) {
          return f32 ? LaunchOne<kBM, kBK, true, WeightKind::kFp4, true>(p)
                     : LaunchOne<kBM, kBK, false, WeightKind::kFp4, true>(p);
        }
      }
      return f32 ? LaunchOne<kBM, kBK, true, WeightKind::kFp4>(p)
                 : LaunchOne<kBM, kBK, false, WeightKind::kFp4>(p);
    }
  }
  if constexpr (kBK >= 128) {  // FP8 and MXFP4 only
    return absl::InternalError(
        "GroupedGemm: 128- and 256-wide slices are for FP8 or MXFP4 weights");
  } else {
    return f32 ? LaunchOne<kBM, kBK, true, WeightKind::kBf16>(p)
               : LaunchOne<kBM, kBK, false, WeightKind::kBf16>(p);
  }
}

template <int kBK>
absl::Status LaunchTile(const GroupedGemmParams& p) {
  switch (p.tile_m) {
    case 16:
      return Launch<16, kBK>(p);
    case 32:
      return Launch<32, kBK>(p);
    default:
      return Launch<64, kBK>(p);
  }
}

}  // namespace

int GroupedGemmMaxTiles(int rows, int num_experts, int tile_m) {
  return (rows + tile_m - 1) / tile_m + std::min(num_experts, rows);
}

absl::Status RunGroupedGemm(const GroupedGemmParams& p) {
  GroupedGemmParams q = p;
  if (q.ldx == 0) q.ldx = q.k;
  if (q.ldy == 0) q.ldy = q.n;
  if (q.num_experts < 1 || q.n <= 0 || q.k <= 0 || q.k % 32 != 0 || q.n % 8 != 0 ||
      q.ldx % 8 != 0 || q.ldx < q.k || q.ldy < q.n || q.ldy % 2 != 0 ||
      (q.tile_m != 16 && q.tile_m != 32 && q.tile_m != 64) || q.max_tiles < 0 ||
      (q.n + kBN - 1) / kBN > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunGroupedGemm: need k % 32 == 0, n % 8 == 0, ldx % 8 == 0, even ldy, tile_m "
                     "16, 32 or 64"));
  }
  if (q.max_tiles == 0) return absl::OkStatus();
  if (q.x_fp8 != nullptr) {  // FP8 activations (grouped_gemm_fp8.cu)
    if (q.x != nullptr || q.row_index != nullptr || q.w != nullptr || q.w_fp4 != nullptr ||
        !q.x_scale || !q.w_fp8 || !q.w_scale || !q.y || !q.expert_offsets || !q.tile_offsets ||
        q.k % 128 != 0 || q.ldx % 16 != 0 || q.x_scale_ld < 1 ||
        (q.k_tile != 0 && q.k_tile != 128) ||
        ((reinterpret_cast<uintptr_t>(q.x_fp8) | reinterpret_cast<uintptr_t>(q.w_fp8)) & 15)) {
      return absl::InvalidArgumentError(
          "RunGroupedGemm: FP8 activations need x, w, w_fp4 and row_index null, x_scale, w_fp8 + "
          "w_scale, "
          "k % 128 == 0, ldx % 16 == 0, x_scale_ld >= 1, k_tile 0 or 128, 16-byte aligned x_fp8 "
          "and w_fp8");
    }
    return LaunchGroupedGemmFp8(q);
  }
  const int formats = (q.w != nullptr) + (q.w_fp8 != nullptr) + (q.w_fp4 != nullptr);
  if (!q.x || formats != 1 || (q.w_fp8 && !q.w_scale) || (q.w_fp4 && !q.w_mx_scale) || !q.y ||
      !q.expert_offsets || !q.tile_offsets) {
    return absl::InvalidArgumentError(
        "RunGroupedGemm: null pointer (or not exactly one of w, w_fp8 + w_scale, w_fp4 + "
        "w_mx_scale)");
  }
  const void* w = q.w != nullptr       ? static_cast<const void*>(q.w)
                  : q.w_fp8 != nullptr ? static_cast<const void*>(q.w_fp8)
                                       : static_cast<const void*>(q.w_fp4);
  if ((reinterpret_cast<uintptr_t>(q.x) | reinterpret_cast<uintptr_t>(w)) & 15) {
    return absl::InvalidArgumentError("RunGroupedGemm: x and w must be 16-byte aligned");
  }
  if (reinterpret_cast<uintptr_t>(q.w_mx_scale) & 7) {
    return absl::InvalidArgumentError("RunGroupedGemm: w_mx_scale must be 8-byte aligned");
  }
  if (q.k_tile != 0 && q.k_tile != 32 && q.k_tile != 64 && !(q.k_tile == 128 && q.w_fp8)) {
    return absl::InvalidArgumentError(
        "RunGroupedGemm: k_tile must be 0, 32 or 64 (or 128 with FP8 weights)");
  }
  // FP8 weights take a whole scale block a slice where k allows.
  if (q.w_fp8 && q.k % 128 == 0 && (q.k_tile == 0 || q.k_tile == 128)) return LaunchTile<128>(q);
  // MXFP4 decode tiles: 256 wide where k allows (128 bytes of a weight row a
  // slice, GemmCfg: 1201.6 -> 1028.3 us at V4-Flash gate_up 256 x 6 rows,
  // H100), else 128 (four groups of 32 a slice: a quarter of the barriers and
  // ring turns a byte of 64-wide slices; 1.20x at 256 x 6 rows).
  if (q.w_fp4 && q.k_tile == 0 && q.tile_m < 64) {
    if (q.k % 256 == 0) return LaunchTile<256>(q);
    if (q.k % 128 == 0) return LaunchTile<128>(q);
  }
  if (q.k_tile == 128)
    return absl::InvalidArgumentError("RunGroupedGemm: k_tile 128 needs k % 128 == 0");
  const bool wide = q.k_tile == 64 || (q.k_tile == 0 && q.k % 64 == 0);
  if (wide && q.k % 64 != 0)
    return absl::InvalidArgumentError("RunGroupedGemm: k_tile 64 needs k % 64 == 0");
  return wide ? LaunchTile<64>(q) : LaunchTile<32>(q);
}

}  // namespace moesh::cuda
