// The batched bf16 GEMV (bf16_gemv.h). CTA (16 weight rows, batch entry b),
// kWarps warps splitting k in 32-wide chunks (warp w: chunks w, w + kWarps,
// ...). For a chunk, thread (g, tq) loads 8 contiguous values (16 bytes) of
// weight rows g and g + 8 and of activation row g, at 8 tq. Two
// mma.m16n8k16 take them with the MMA's k order permuted alike in A and B,
// so the products pair up: the first values 0-1 (a0 / a1, b0) and 2-3 (a2 /
// a3, b1), the second 4-5 and 6-7 (as fp8_gemv.cu does with e4m3 bytes).
// The warps' sums meet in shared memory.
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/bf16_gemv.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/gemv_store.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pdl.cuh"

namespace moesh::cuda {
namespace {

constexpr int kRows = 16;   // weight rows a CTA (the MMA's M)
constexpr int kChunk = 32;  // k a warp's step covers
constexpr int kWarps = 4;

__device__ __forceinline__ uint4 Load16(const bf16* p, bool ok) {
  return ok ? *reinterpret_cast<const uint4*>(p) : make_uint4(0, 0, 0, 0);
}

__global__ void __launch_bounds__(kWarps * 32) Bf16GemvKernel(BatchedGemmParams p) {
  __shared__ float part[kWarps][32][4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int row0 = blockIdx.x * kRows, b = blockIdx.y;
  const bf16* w = p.w + b * p.stride_w;
  // Launched programmatically: this CTA's weight rows start for L2 while
  // the kernel before it ends; x and y only after the wait.
  if (threadIdx.x < kRows && row0 + threadIdx.x < p.n) {
    BulkPrefetchL2(w + static_cast<int64_t>(row0 + threadIdx.x) * p.ldw,
                   static_cast<uint32_t>(p.k) * 2);
  }
  PdlBegin();
  const int r_lo = row0 + g, r_hi = r_lo + 8;
  const bool ok_lo = r_lo < p.n, ok_hi = r_hi < p.n, ok_x = g < p.m;
  const bf16* w_lo = w + static_cast<int64_t>(ok_lo ? r_lo : 0) * p.ldw + 8 * tq;
  const bf16* w_hi = w + static_cast<int64_t>(ok_hi ? r_hi : 0) * p.ldw + 8 * tq;
  const bf16* xr = p.x + b * p.stride_x + static_cast<int64_t>(ok_x ? g : 0) * p.ldx + 8 * tq;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  const int chunks = p.k / kChunk;
#pragma unroll 4
  for (int c = warp; c < chunks; c += kWarps) {
    const int k0 = c * kChunk;
    const uint4 lo = Load16(w_lo + k0, ok_lo), hi = Load16(w_hi + k0, ok_hi);
    const uint4 xv = Load16(xr + k0, ok_x);
    const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y};
    const uint32_t a1[4] = {lo.z, hi.z, lo.w, hi.w};
    Mma(acc, a0, xv.x, xv.y);
    Mma(acc, a1, xv.z, xv.w);
  }
  const size_t es = p.out_type == OutType::kFloat32 ? sizeof(float) : sizeof(bf16);
  GemvReduceStore<kWarps>(part, acc, static_cast<char*>(p.y) + b * p.stride_y * es, p.ldy, r_lo,
                          p.n, p.m, p.out_type, p.accumulate);
}

}  // namespace

bool Bf16GemvFits(const BatchedGemmParams& p) {
  const int ldx = p.ldx ? p.ldx : p.k, ldw = p.ldw ? p.ldw : p.k, ldy = p.ldy ? p.ldy : p.n;
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return p.m >= 1 && p.m <= kBf16GemvMaxRows && !p.w_kn && p.batch >= 1 && p.batch <= 65535 &&
         p.n >= 1 && p.k >= kChunk && p.k % kChunk == 0 && ldx >= p.k && ldw >= p.k &&
         ldx % 8 == 0 && ldw % 8 == 0 && p.stride_x % 8 == 0 && p.stride_w % 8 == 0 && ldy >= p.n &&
         p.x != nullptr && p.w != nullptr && p.y != nullptr && aligned(p.x) && aligned(p.w);
}

absl::Status RunBf16Gemv(const BatchedGemmParams& p) {
  BatchedGemmParams q = p;
  q.ldx = p.ldx ? p.ldx : p.k, q.ldw = p.ldw ? p.ldw : p.k, q.ldy = p.ldy ? p.ldy : p.n;
  if (!Bf16GemvFits(p)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunBf16Gemv: m ", p.m, ", n ", p.n, ", k ", p.k, ": need 1 <= m <= ", kBf16GemvMaxRows,
        ", w as [n, ldw], k a multiple of 32, 16-byte rows and pointers, y set, ldy >= n"));
  }
  const dim3 grid((p.n + kRows - 1) / kRows, p.batch);
  return LaunchPdl("Bf16GemvKernel", Bf16GemvKernel, grid, kWarps * 32, 0, p.stream, q);
}

}  // namespace moesh::cuda
