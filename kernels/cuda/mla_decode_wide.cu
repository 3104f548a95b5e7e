// MLA decode with 64 heads per CTA (MlaTileConfig::kHeads64Tokens64Stages2),
// for the wide-head models (V2/V3/V3.2: 128 heads): each cache byte a CTA
// streams serves 64 heads, so a sequence's KV crosses L2 num_heads / 64 times
// instead of num_heads / 16 (BENCHMARKS.md: the 16-head kernel moved 5.8 GB
// through L2 for 1.0 GB of cache at 128 heads).
//
// One CTA = (KV split, group of 64 heads, sequence), two warpgroups:
//   * Q [64 heads, 576] sits in shared memory for the whole CTA (SW128
//     column blocks, wgmma.cuh); thread 0 streams the split's cache blocks
//     (64 tokens = one tile) with nine 2-D tensor copies each (a 64 x 64
//     box per column block, swizzled by the copy engine) into a two-stage
//     ring, completing on an mbarrier per stage;
//   * S = Q · K^T: warpgroup w scores tokens [32w, 32w + 32) of the tile
//     over all 576 dims (36 wgmma m64n32k16);
//   * online softmax in fp32 (base 2): the two warpgroups trade row maxima
//     through shared memory, so both rescale by the same max; P goes to
//     shared memory as bf16 (the A operand of the next product);
//   * O += P · V: warpgroup w owns latent dims [256w, 256w + 256)
//     (4 wgmma m64n256k16 with V read MN-major from the same tile).
// Splits write (O / l, log2-sum-exp) partials for mla_decode.cu's combine.
#include <cuda.h>
#include <cudaTypedefs.h>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/mla_decode_common.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace moesh::cuda::mla {
namespace {

constexpr int kTile = kKvBlockSize;                   // tokens per tile: one cache block
constexpr int kStages = 2;                            // tiles in flight
constexpr int kColBlocks = kHeadDim / 64;             // 9 SW128 column blocks of a row
constexpr int kBlockBytes = kTile * 128;              // one column block of 64 rows: 8 KB
constexpr int kTileBytes = kColBlocks * kBlockBytes;  // 72 KB: Q, or one KV tile
constexpr int kHalfTokens = kTile / 2;                // tokens a warpgroup scores
constexpr int kOutDims = kLatentDim / 2;              // latent dims a warpgroup owns
constexpr int kSRegs = kHalfTokens / 2;               // m64n32 accumulators per thread
constexpr int kORegs = kOutDims / 2;                  // m64n256 accumulators per thread
static_assert(kWideHeads == 64 && kWideThreads == 256 && kHeadDim % 64 == 0);

struct Smem {
  uint8_t q[kTileBytes];            // [64 heads, 576], SW128 column blocks
  uint8_t kv[kStages][kTileBytes];  // [64 tokens, 576] per stage
  uint8_t p[kBlockBytes];           // [64 heads, 64 tokens] bf16 probabilities
  float rmax[2][kWideHeads];        // per warpgroup: its tokens' row maxima
  float rsum[2][kWideHeads];        // per warpgroup: its row sums (epilogue)
  alignas(8) uint64_t bar[kStages];
};
// 1 KB of slack to align the dynamic shared memory to 1024 bytes (SW128).
constexpr int kSmemBytes = static_cast<int>(sizeof(Smem)) + 1024;
static_assert(kSmemBytes <= 227 * 1024, "over Hopper's shared memory per CTA");

// Thread 0: arms `stage` and copies tile `tile` of sequence b into it.
__device__ __forceinline__ void IssueTile(Smem& s, const CUtensorMap* map, const MlaDecodeParams& p,
                                          int b, int tile, int stage) {
  const int block = p.block_table[static_cast<int64_t>(b) * p.max_blocks_per_seq + tile];
  MbarArriveExpectTx(&s.bar[stage], kTileBytes);
#pragma unroll
  for (int c = 0; c < kColBlocks; ++c) {
    TmaLoad2D(&s.kv[stage][c * kBlockBytes], map, c * 64, block * kKvBlockSize, &s.bar[stage]);
  }
}

// Rows [valid, 64) of a tile past the sequence's end become zeros (their
// probabilities are 0, and 0 · NaN of whatever the pool holds there would
// poison O). A row is 128 contiguous bytes in each column block.
__device__ __forceinline__ void ZeroRows(uint8_t* tile, int valid, int tid) {
  const int chunks = (kTile - valid) * kColBlocks * 8;  // 16-byte chunks
  for (int i = tid; i < chunks; i += kWideThreads) {
    const int row = valid + i / (kColBlocks * 8), rest = i % (kColBlocks * 8);
    *reinterpret_cast<uint4*>(tile + (rest / 8) * kBlockBytes + row * 128 + (rest % 8) * 16) =
        make_uint4(0, 0, 0, 0);
  }
}

template <bool kSplit, typename OutT>
__global__ void __launch_bounds__(kWideThreads, 1)
    MlaDecodeWideKernel(const __grid_constant__ CUtensorMap map, MlaDecodeParams p) {
  extern __shared__ uint8_t smem_raw[];
  Smem& s =
      *reinterpret_cast<Smem*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  const int split = blockIdx.x, head0 = blockIdx.y * kWideHeads, b = blockIdx.z;
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, tq = lane % 4;                  // accumulator row group / thread in group
  const int row_lo = warp * 16 + g, row_hi = row_lo + 8;  // this thread's two heads (of 64)
  const int seq_len = p.seq_lens[b];
  const int n_tiles = (seq_len + kTile - 1) / kTile;
  const SplitRange range = SplitTiles(n_tiles, split, p.num_splits);
  const int n = range.end - range.begin;

  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) MbarInit(&s.bar[st], 1);
    FenceMbarInit();
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(&map)) : "memory");
  }
  __syncthreads();
  if (tid == 0) {
    for (int i = 0; i < min(n, kStages); ++i) IssueTile(s, &map, p, b, range.begin + i, i);
  }
  // Q rows (zeros past num_heads) into SW128 column blocks.
  for (int i = tid; i < kWideHeads * kColBlocks * 8; i += kWideThreads) {
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

  const float scale_log2 = p.softmax_scale * kLog2e;
  float o[kORegs];
#pragma unroll
  for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;

  for (int i = 0; i < n; ++i) {
    const int stage = i % kStages, tile = range.begin + i;
    uint8_t* kv = s.kv[stage];
    MbarWait(&s.bar[stage], (i / kStages) & 1);
    const int valid = min(kTile, seq_len - tile * kTile);
    if (valid < kTile) {  // the sequence's last tile: the same branch for the whole CTA
      ZeroRows(kv, valid, tid);
      wgmma::FenceProxyAsync();
      __syncthreads();
    }

    // S[64 heads, this warpgroup's 32 tokens] over the 576 dims.
    float sc[kSRegs];
#pragma unroll
    for (int r = 0; r < kSRegs; ++r) sc[r] = 0.0f;
    wgmma::FenceOperands(sc);
    wgmma::Fence();
#pragma unroll
    for (int c = 0; c < kColBlocks; ++c) {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        wgmma::WgmmaM64N32K16<0>(
            sc, wgmma::DescKMajor(s.q + c * kBlockBytes + kk * 32),
            wgmma::DescKMajor(kv + c * kBlockBytes + wg * kHalfTokens * 128 + kk * 32), 1);
      }
    }
    wgmma::Commit();
    wgmma::Wait<0>();
    wgmma::FenceOperands(sc);

    // Scale, mask past the end, and this warpgroup's row maxima.
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int j = 0; j < kSRegs / 4; ++j) {
      const int tok = tile * kTile + wg * kHalfTokens + j * 8 + 2 * tq;
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
    if (tq == 0) {
      s.rmax[wg][row_lo] = mx_lo;
      s.rmax[wg][row_hi] = mx_hi;
    }
    __syncthreads();
    // Every tile holds a token of the sequence, so the new maxima are finite.
    const float new_lo = fmaxf(m_lo, fmaxf(s.rmax[0][row_lo], s.rmax[1][row_lo]));
    const float new_hi = fmaxf(m_hi, fmaxf(s.rmax[0][row_hi], s.rmax[1][row_hi]));
    float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
    for (int j = 0; j < kSRegs / 4; ++j) {
      const uint32_t plo = PackBf16(exp2f(sc[4 * j + 0] - new_lo), exp2f(sc[4 * j + 1] - new_lo));
      const uint32_t phi = PackBf16(exp2f(sc[4 * j + 2] - new_hi), exp2f(sc[4 * j + 3] - new_hi));
      const int col = wg * kHalfTokens + j * 8 + 2 * tq;
      *reinterpret_cast<uint32_t*>(s.p + wgmma::Swizzle128Offset(row_lo, col)) = plo;
      *reinterpret_cast<uint32_t*>(s.p + wgmma::Swizzle128Offset(row_hi, col)) = phi;
      // Sum what P·V will use: the rounded probabilities.
      const float2 a = UnpackBf16(plo), c = UnpackBf16(phi);
      sum_lo += a.x + a.y;
      sum_hi += c.x + c.y;
    }
    const float alpha_lo = exp2f(m_lo - new_lo), alpha_hi = exp2f(m_hi - new_hi);
    m_lo = new_lo;
    m_hi = new_hi;
    l_lo = l_lo * alpha_lo + sum_lo;  // this thread's columns; reduced in the epilogue
    l_hi = l_hi * alpha_hi + sum_hi;
#pragma unroll
    for (int j = 0; j < kORegs / 4; ++j) {
      o[4 * j + 0] *= alpha_lo, o[4 * j + 1] *= alpha_lo;
      o[4 * j + 2] *= alpha_hi, o[4 * j + 3] *= alpha_hi;
    }
    wgmma::FenceProxyAsync();
    __syncthreads();  // P complete, and every row max read before the next tile writes them

    // O[64 heads, this warpgroup's 256 dims] += P[64, 64 tokens] · V[64 tokens, 256 dims].
    wgmma::FenceOperands(o);
    wgmma::Fence();
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      wgmma::WgmmaM64N256K16<1>(
          o, wgmma::DescKMajor(s.p + kk * 32),
          wgmma::DescMnMajor(kv + wg * (kOutDims / 64) * kBlockBytes + kk * 16 * 128, kBlockBytes),
          1);
    }
    wgmma::Commit();
    wgmma::Wait<0>();
    wgmma::FenceOperands(o);
    __syncthreads();  // the stage and P are free again
    if (tid == 0 && i + kStages < n) {
      wgmma::FenceProxyAsync();  // the zeroed rows' writes before the copy's
      IssueTile(s, &map, p, b, tile + kStages, stage);
    }
  }

  // Row sums: over this thread's quad, then over the two warpgroups' tokens.
#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  if (tq == 0) {
    s.rsum[wg][row_lo] = l_lo;
    s.rsum[wg][row_hi] = l_hi;
  }
  __syncthreads();
  l_lo = s.rsum[0][row_lo] + s.rsum[1][row_lo];
  l_hi = s.rsum[0][row_hi] + s.rsum[1][row_hi];

#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int h = head0 + (half ? row_hi : row_lo);
    if (h >= p.num_heads) continue;
    const float l = half ? l_hi : l_lo, m = half ? m_hi : m_lo;
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

// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda).
absl::StatusOr<PFN_cuTensorMapEncodeTiled_v12000> EncodeTiledFn() {
  static const absl::StatusOr<PFN_cuTensorMapEncodeTiled_v12000> fn =
      []() -> absl::StatusOr<PFN_cuTensorMapEncodeTiled_v12000> {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    RETURN_IF_CUDA_ERROR(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                          cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess || f == nullptr) {
      return absl::InternalError("cuTensorMapEncodeTiled: not in this driver");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// The paged cache as a 2-D tensor [num_blocks * 64 rows, 576] of bf16, read
// in 64 x 64 boxes swizzled for SW128.
absl::StatusOr<CUtensorMap> CacheMap(const MlaDecodeParams& p) {
  ASSIGN_OR_RETURN(auto encode, EncodeTiledFn());
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(kHeadDim),
                              static_cast<cuuint64_t>(p.num_blocks) * kKvBlockSize};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(kHeadDim) * sizeof(bf16)};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(kTile)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(p.kv_cache), dims,
             strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled over the KV cache: error ", r));
  }
  return map;
}

template <bool kSplit, typename OutT>
absl::Status Launch(const CUtensorMap& map, const MlaDecodeParams& p) {
  constexpr auto kernel = MlaDecodeWideKernel<kSplit, OutT>;
  RETURN_IF_ERROR(AllowDynamicSmem<kernel>(kSmemBytes));
  const dim3 grid(p.num_splits, (p.num_heads + kWideHeads - 1) / kWideHeads, p.batch);
  kernel<<<grid, kWideThreads, kSmemBytes, p.stream>>>(map, p);
  return LaunchStatus("MlaDecodeWideKernel");
}

}  // namespace

absl::Status LaunchMlaDecodeWide(const MlaDecodeParams& p) {
  ASSIGN_OR_RETURN(const CUtensorMap map, CacheMap(p));
  const bool split = p.num_splits > 1;
  if (p.out_type == OutType::kFloat32) {
    return split ? Launch<true, float>(map, p) : Launch<false, float>(map, p);
  }
  return split ? Launch<true, bf16>(map, p) : Launch<false, bf16>(map, p);
}

}  // namespace moesh::cuda::mla
