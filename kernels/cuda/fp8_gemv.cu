// DeepSeek's block-scaled FP8 linear at decode sizes (m <= 8 rows of
// activations), y = x · w^T with x and w e4m3 and their 128-wide block scales
// (Fp8GemmParams), on the tensor cores without cuBLASLt's four-row padding:
// the weight rows are the MMA's M (16 a CTA), the activation rows its N (8),
// so every weight byte is read once, straight from global memory into the
// fragments.
//
// One CTA = 16 weight rows, kWarps warps splitting the 128-wide k blocks
// (warp w: blocks w, w + kWarps, ...): eight where the rows make few CTAs
// (n <= kWideRowsMax: more of each CTA's loads in flight), four elsewhere. For a 64-wide slice of a
// block, thread (g, tq) loads 16 contiguous codes of weight rows g and g + 8 and of activation row
// g: bytes [16 tq, 16 tq + 16) of the slice. Two mma.m16n8k32 take them as k = (the MMA's k order
// permuted alike in A and B, so the products pair up): the first bytes 0-3 (a0 / a1, b0) and 4-7
// (a2 / a3, b1), the second 8-11 and 12-15. A block's products (fp32) are
// then scaled by x_scale[row, block] · w_scale[row block, block] into the
// thread's running sums; the warps' sums meet in shared memory.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/fp8_quant.cuh"
#include "kernels/cuda/gemv_store.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pdl.cuh"

namespace moesh::cuda {
namespace {

// kernel_bench --fp8 (H100, 2026-12-06), quantize + GEMV at m = 1, four
// warps against eight: n 2112 k 7168 11.5 / 7.4 us, n 4096 k 7168 11.7 / 8.9,
// n 576..3072 k 2048 5.5-5.9 / 4.4-5.0; but n 7168 k 2048..18432 6.5 / 7.1,
// 58.3 / 60.6, 64.0 / 67.0 and n 24576 k 1536 12.4 / 15.7.
constexpr int kWideRowsMax = 4096;
constexpr int kRows = 16;   // weight rows a CTA (the MMA's M)
constexpr int kSlice = 64;  // k a thread group's 16-byte loads cover
constexpr int kBlock = cpu::kFp8Block;
static_assert(kBlock == 2 * kSlice, "a block is two slices");

__device__ __forceinline__ uint4 Load16(const uint8_t* p, bool ok) {
  return ok ? *reinterpret_cast<const uint4*>(p) : make_uint4(0, 0, 0, 0);
}

// Quantizes thread (g, tq)'s 16 bf16 values of each 64-wide slice of a
// block of activation row g (raw[s][0..1]) the way RunQuantizeFp8 does:
// the row's block amax over the four tq lanes (which hold its 128 values),
// scale = max(amax, kFp8MinAmax) / 448, codes e4m3(v / scale) in k order.
// Returns the scale; every lane of the warp calls it. Lanes of rows past m
// (!live) leave their codes 0 without dividing: 0 / scale takes the IEEE
// division's slow path (at m = 1, 28 of 32 lanes: the V2-Lite step at batch
// 1 went from 3.29 to 4.58 ms with them dividing).
__device__ __forceinline__ float QuantizeSlices(const uint4 (&raw)[2][2], bool live,
                                                uint4 (&codes)[2]) {
  float v[2][16];
  float amax = 0.0f;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t words[4] = {raw[s][h].x, raw[s][h].y, raw[s][h].z, raw[s][h].w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[w]));
        v[s][8 * h + 2 * w] = f.x, v[s][8 * h + 2 * w + 1] = f.y;
        amax = fmaxf(amax, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
    }
  }
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  const float scale = fp8q::BlockScale(amax);
  if (!live) {
    codes[0] = codes[1] = make_uint4(0, 0, 0, 0);
    return scale;
  }
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    uint32_t packed[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      packed[w] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        packed[w] |= fp8q::Code(v[s][4 * w + j], scale) << (8 * j);
      }
    }
    codes[s] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
  return scale;
}

// kBf16In: x is bf16 (p.x_bf16), quantized here block by block
// (QuantizeSlices) instead of read as codes and scales.
template <int kWarps, bool kBf16In>
__global__ void __launch_bounds__(kWarps * 32) Fp8GemvKernel(Fp8GemmParams p) {
  __shared__ float part[kWarps][32][4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int row0 = blockIdx.x * kRows;
  // Launched programmatically (pdl.cuh): this CTA's weight rows start for L2
  // while the kernel before it ends; x, x_scale and y only after the wait.
  if (threadIdx.x < kRows && row0 + threadIdx.x < p.n) {
    BulkPrefetchL2(p.w + static_cast<int64_t>(row0 + threadIdx.x) * p.k,
                   static_cast<uint32_t>(p.k));
  }
  PdlBegin();
  const int r_lo = row0 + g, r_hi = r_lo + 8;
  const bool ok_lo = r_lo < p.n, ok_hi = r_hi < p.n, ok_x = g < p.m;
  const uint8_t* w_lo = p.w + static_cast<int64_t>(r_lo) * p.k + 16 * tq;
  const uint8_t* w_hi = p.w + static_cast<int64_t>(r_hi) * p.k + 16 * tq;
  const uint8_t* xr = kBf16In ? nullptr : p.x + static_cast<int64_t>(g) * p.k + 16 * tq;
  // kBf16In: bytes of row g from its value 16 tq on (two bytes a value).
  const uint8_t* xb =
      kBf16In
          ? reinterpret_cast<const uint8_t*>(p.x_bf16 + static_cast<int64_t>(g) * p.ldx + 16 * tq)
          : nullptr;
  const int blocks = cpu::Fp8Blocks(p.k), x_rows = Fp8Rows(p.m);
  // This CTA's rows lie in one 128-row scale block (16 divides 128).
  const float* w_scale = p.w_scale + static_cast<int64_t>(row0 / kBlock) * Fp8ScaleStride(p.k);
  // Activation rows 2 tq and 2 tq + 1: the columns of this thread's sums.
  const int t0 = 2 * tq, t1 = 2 * tq + 1;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  // Both 64-wide slices' loads issued before any MMA (the second predicated
  // off in a last block of 64: k a multiple of 64), two blocks in flight.
#pragma unroll 2
  for (int b = warp; b < blocks; b += kWarps) {
    const int k0 = b * kBlock;
    const bool two = k0 + kBlock <= p.k;
    uint4 lo[2], hi[2], xv[2], raw[2][2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int ks = k0 + s * kSlice;
      const bool in = s == 0 || two;
      lo[s] = Load16(w_lo + ks, ok_lo && in);
      hi[s] = Load16(w_hi + ks, ok_hi && in);
      if constexpr (kBf16In) {
        raw[s][0] = Load16(xb + 2 * ks, ok_x && in);
        raw[s][1] = Load16(xb + 2 * ks + 16, ok_x && in);
      } else {
        xv[s] = Load16(xr + ks, ok_x && in);
      }
    }
    float xs0, xs1;
    if constexpr (kBf16In) {
      const float scale = QuantizeSlices(raw, ok_x, xv);  // row g's, block b
      const float s0 = __shfl_sync(0xffffffffu, scale, 4 * t0);
      const float s1 = __shfl_sync(0xffffffffu, scale, 4 * t1);
      xs0 = t0 < p.m ? s0 : 0.0f, xs1 = t1 < p.m ? s1 : 0.0f;
    } else {
      xs0 = t0 < p.m ? p.x_scale[static_cast<int64_t>(b) * x_rows + t0] : 0.0f;
      xs1 = t1 < p.m ? p.x_scale[static_cast<int64_t>(b) * x_rows + t1] : 0.0f;
    }
    float blk[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const uint32_t a0[4] = {lo[s].x, hi[s].x, lo[s].y, hi[s].y};
      const uint32_t a1[4] = {lo[s].z, hi[s].z, lo[s].w, hi[s].w};
      MmaE4m3(blk, a0, xv[s].x, xv[s].y);
      MmaE4m3(blk, a1, xv[s].z, xv[s].w);
    }
    const float ws = w_scale[b];
    acc[0] += blk[0] * (ws * xs0), acc[1] += blk[1] * (ws * xs1);
    acc[2] += blk[2] * (ws * xs0), acc[3] += blk[3] * (ws * xs1);
  }
  GemvReduceStore<kWarps>(part, acc, p.y, p.ldy, r_lo, p.n, p.m, p.out_type, p.accumulate);
}

}  // namespace

absl::Status RunFp8Gemv(const Fp8GemmParams& p) {
  Fp8GemmParams q = p;
  q.ldy = p.ldy ? p.ldy : p.n;
  q.ldx = p.ldx ? p.ldx : p.k;
  if (p.m < 1 || p.m > kFp8GemvMaxRows || p.n < 1 || p.k < kSlice || p.k % kSlice != 0 ||
      q.ldy < p.n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunFp8Gemv: m ", p.m, ", n ", p.n, ", k ", p.k, ", ldy ", q.ldy,
        ": need 1 <= m <= ", kFp8GemvMaxRows, ", n >= 1, k a positive multiple of 64, ldy >= n"));
  }
  const bool bf16_in = p.x_bf16 != nullptr;
  if (bf16_in ? (q.ldx < p.k || q.ldx % 8 != 0 || reinterpret_cast<uintptr_t>(p.x_bf16) % 16 != 0)
              : (!p.x || !p.x_scale || reinterpret_cast<uintptr_t>(p.x) % 16 != 0)) {
    return absl::InvalidArgumentError(
        "RunFp8Gemv: x / x_scale null or x not 16-byte aligned, or x_bf16 with ldx < k, ldx not a "
        "multiple of 8 or x_bf16 not 16-byte aligned");
  }
  if (!p.w || !p.w_scale || !p.y || reinterpret_cast<uintptr_t>(p.w) % 16 != 0) {
    return absl::InvalidArgumentError("RunFp8Gemv: null pointer, or w not 16-byte aligned");
  }
  const int grid = (p.n + kRows - 1) / kRows;
  const auto launch = [&](auto kernel, int warps) {
    return LaunchPdl("Fp8GemvKernel", kernel, grid, warps * 32, 0, p.stream, q);
  };
  if (p.n <= kWideRowsMax) {
    return bf16_in ? launch(Fp8GemvKernel<8, true>, 8) : launch(Fp8GemvKernel<8, false>, 8);
  }
  return bf16_in ? launch(Fp8GemvKernel<4, true>, 4) : launch(Fp8GemvKernel<4, false>, 4);
}

}  // namespace moesh::cuda
