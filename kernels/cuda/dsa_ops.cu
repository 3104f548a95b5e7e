// The lightning indexer and V3.2's indexer key (dsa_ops.h states the math).
// The indexer's top-k is an exact radix select: the k-th largest score's
// order-preserving 32-bit key is found 8 bits at a time with a histogram in
// shared memory; the keys above it are taken, then the earliest of the keys
// equal to it (the CPU reference's tie rule).
#include <cfloat>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/dsa_ops.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/rope.cuh"

namespace moesh::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHeads = 64;
constexpr unsigned kFull = 0xffffffffu;

// Larger float -> larger key; -0 and +0 alike.
__device__ __forceinline__ uint32_t OrderedKey(float s) {
  const uint32_t u = __float_as_uint(s + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Scores, a CTA per (kThreads keys, token), a thread per key with every
// head's dot product in registers.
__global__ void __launch_bounds__(kThreads) IndexScoreKernel(IndexerParams p) {
  PdlBegin();
  extern __shared__ float q[];  // [num_heads, head_dim], then w [num_heads]
  const int t = blockIdx.y;
  const int visible = p.seq_lens[t] / p.rate;
  const int e = blockIdx.x * kThreads + threadIdx.x;
  if (visible <= p.top_k || static_cast<int>(blockIdx.x) * kThreads >= visible)
    return;  // block-uniform
  const int nh = p.num_heads, hd = p.head_dim;
  float* w = q + nh * hd;
  const bf16* qt = p.q + static_cast<int64_t>(t) * nh * hd;
  // Transposed, q[x * nh + h]: for each key value, four heads' queries in one 16-byte read.
  for (int i = threadIdx.x; i < nh * hd; i += blockDim.x)
    q[(i % hd) * nh + i / hd] = __bfloat162float(qt[i]);
  for (int h = threadIdx.x; h < nh; h += blockDim.x) {
    w[h] = __bfloat162float(p.w[static_cast<int64_t>(t) * p.ldw + h]) * p.w_scale;
  }
  __syncthreads();
  if (e >= visible) return;
  float dot[kMaxHeads];
#pragma unroll
  for (int h = 0; h < kMaxHeads; ++h) dot[h] = 0.0f;
  const int32_t* bt = p.block_table + static_cast<int64_t>(t) * p.max_blocks_per_seq;
  const int64_t row = static_cast<int64_t>(bt[e / kKvBlockSize]) * kKvBlockSize + e % kKvBlockSize;
  const bf16* kb = p.key_cache + row * p.key_row_width + p.key_offset;
  if (hd % 8 == 0 && (p.key_row_width | p.key_offset) % 8 == 0) {
    // 16-byte loads of 8 key values, the next one in flight while these are used.
    const uint4* k8 = reinterpret_cast<const uint4*>(kb);
    uint4 next = k8[0];
    for (int x0 = 0; x0 < hd; x0 += 8) {
      const uint4 cur = next;
      if (x0 + 8 < hd) next = k8[x0 / 8 + 1];
      const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&cur);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 kx = __bfloat1622float2(pairs[j]);
        const float* q0 = q + (x0 + 2 * j) * nh;
        const float* q1 = q0 + nh;
        if (nh % 4 == 0) {
#pragma unroll
          for (int h = 0; h < kMaxHeads; h += 4) {
            if (h < nh) {
              const float4 a = *reinterpret_cast<const float4*>(q0 + h);
              const float4 b = *reinterpret_cast<const float4*>(q1 + h);
              dot[h] += a.x * kx.x + b.x * kx.y;
              dot[h + 1] += a.y * kx.x + b.y * kx.y;
              dot[h + 2] += a.z * kx.x + b.z * kx.y;
              dot[h + 3] += a.w * kx.x + b.w * kx.y;
            }
          }
        } else {
#pragma unroll
          for (int h = 0; h < kMaxHeads; ++h) {
            if (h < nh) dot[h] += q0[h] * kx.x + q1[h] * kx.y;
          }
        }
      }
    }
  } else {
    for (int x = 0; x < hd; ++x) {
      const float kx = __bfloat162float(kb[x]);
#pragma unroll
      for (int h = 0; h < kMaxHeads; ++h) {
        if (h < nh) dot[h] += q[x * nh + h] * kx;
      }
    }
  }
  float acc = 0.0f;
#pragma unroll
  for (int h = 0; h < kMaxHeads; ++h) {
    if (h < nh) acc += fmaxf(dot[h], 0.0f) * p.scale * w[h];
  }
  p.scores[static_cast<int64_t>(t) * p.max_keys + e] = acc;
}

// The same scores on the tensor cores at DeepSeek's indexer shape (64 heads
// × 128 dims): a CTA per (256 keys, token) as IndexScoreKernel, eight warps
// of 32 keys. S[64 heads, 32 keys] = Q · K^T by mma.m16n8k16 (bf16 products
// exact, fp32 sums in another order than the CUDA-core kernel's), Q and the
// warp's keys staged in shared memory by 16-byte cp.async (rows of 16 chunks,
// chunk c of row r at c ^ (r & 7): conflict-free ldmatrix); then per key
// sum_h relu(S[h]) · w[h] over the warp's lanes, times scale.
constexpr int kMmaHeads = 64, kMmaDim = 128, kMmaWarps = kThreads / 32, kMmaKeys = 32;
constexpr int kMmaChunks = kMmaDim / 8;  // 16-byte chunks a row
struct IndexMmaSmem {
  bf16 q[kMmaHeads * kMmaDim];
  bf16 k[kMmaWarps][kMmaKeys * kMmaDim];
  float w[kMmaHeads];
};

__global__ void __launch_bounds__(kThreads) IndexScoreMmaKernel(IndexerParams p) {
  PdlBegin();
  extern __shared__ __align__(128) uint8_t smem_raw[];
  IndexMmaSmem& s = *reinterpret_cast<IndexMmaSmem*>(smem_raw);
  const int t = blockIdx.y;
  const int visible = p.seq_lens[t] / p.rate;
  if (visible <= p.top_k || static_cast<int>(blockIdx.x) * kThreads >= visible)
    return;  // block-uniform
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int e0 = blockIdx.x * kThreads + warp * kMmaKeys;  // this warp's first key
  const bf16* qt = p.q + static_cast<int64_t>(t) * kMmaHeads * kMmaDim;
  for (int c = threadIdx.x; c < kMmaHeads * kMmaChunks; c += kThreads) {
    const int r = c / kMmaChunks, ch = c % kMmaChunks;
    CpAsync16(&s.q[SwizzledChunk(r, ch, kMmaDim)], qt + r * kMmaDim + ch * 8, true);
  }
  const int32_t* bt = p.block_table + static_cast<int64_t>(t) * p.max_blocks_per_seq;
  for (int c = lane; c < kMmaKeys * kMmaChunks; c += 32) {
    const int r = c / kMmaChunks, ch = c % kMmaChunks, e = e0 + r;
    const bool ok = e < visible;
    const bf16* src = p.key_cache;  // read nothing where !ok
    if (ok) {
      const int64_t row =
          static_cast<int64_t>(bt[e / kKvBlockSize]) * kKvBlockSize + e % kKvBlockSize;
      src = p.key_cache + row * p.key_row_width + p.key_offset + ch * 8;
    }
    CpAsync16(&s.k[warp][SwizzledChunk(r, ch, kMmaDim)], src, ok);
  }
  CpAsyncCommit();
  for (int h = threadIdx.x; h < kMmaHeads; h += kThreads) {
    s.w[h] = __bfloat162float(p.w[static_cast<int64_t>(t) * p.ldw + h]) * p.w_scale;
  }
  CpAsyncWait<0>();
  __syncthreads();
  if (e0 >= visible) return;  // warp-uniform: nothing of this warp's is read below

  float acc[kMmaHeads / 16][kMmaKeys / 8][4] = {};
  const int lm_r = lane & 7, lm_m = lane >> 3;  // ldmatrix: row in a matrix, which matrix
  const bf16* sk = s.k[warp];
#pragma unroll
  for (int kk = 0; kk < kMmaDim / 16; ++kk) {
    uint32_t b[kMmaKeys / 16][4];  // matrices (keys +0/+8 by lm_m >> 1) x (dims +0/+8 by lm_m & 1)
#pragma unroll
    for (int np = 0; np < kMmaKeys / 16; ++np) {
      Ldmatrix4(b[np],
                sk + SwizzledChunk(np * 16 + (lm_m >> 1) * 8 + lm_r, kk * 2 + (lm_m & 1), kMmaDim));
    }
#pragma unroll
    for (int mt = 0; mt < kMmaHeads / 16; ++mt) {
      uint32_t a[4];  // matrices (heads +0/+8 by lm_m & 1) x (dims +0/+8 by lm_m >> 1)
      Ldmatrix4(
          a, s.q + SwizzledChunk(mt * 16 + (lm_m & 1) * 8 + lm_r, kk * 2 + (lm_m >> 1), kMmaDim));
#pragma unroll
      for (int np = 0; np < kMmaKeys / 16; ++np) {
        Mma(acc[mt][2 * np], a, b[np][0], b[np][1]);
        Mma(acc[mt][2 * np + 1], a, b[np][2], b[np][3]);
      }
    }
  }
  // Per key: this thread's heads (g and g + 8 of each 16), then the eight
  // lanes sharing tq (lane bits 2..4).
  float part[kMmaKeys / 8][2];
#pragma unroll
  for (int nt = 0; nt < kMmaKeys / 8; ++nt) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      float v = 0.0f;
#pragma unroll
      for (int mt = 0; mt < kMmaHeads / 16; ++mt) {
        v += fmaxf(acc[mt][nt][c], 0.0f) * s.w[mt * 16 + g] +
             fmaxf(acc[mt][nt][c + 2], 0.0f) * s.w[mt * 16 + g + 8];
      }
#pragma unroll
      for (int off = 4; off < 32; off <<= 1) v += __shfl_xor_sync(kFull, v, off);
      part[nt][c] = v;
    }
  }
  if (g == 0) {
    float* out = p.scores + static_cast<int64_t>(t) * p.max_keys;
#pragma unroll
    for (int nt = 0; nt < kMmaKeys / 8; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int e = e0 + nt * 8 + 2 * tq + c;
        if (e < visible) out[e] = part[nt][c] * p.scale;
      }
    }
  }
}

// The top_k of each token's scores, a CTA per token.
__global__ void __launch_bounds__(kThreads) IndexSelectKernel(IndexerParams p) {
  PdlBegin();
  __shared__ int hist[256];
  __shared__ int warp_cnt[kThreads / 32];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining, s_above, s_taken;
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int visible = p.seq_lens[t] / p.rate;
  int32_t* sel = p.selected + static_cast<int64_t>(t) * p.top_k;
  if (visible <= p.top_k) {  // block-uniform
    for (int e = threadIdx.x; e < visible; e += blockDim.x) sel[e] = e;
    if (threadIdx.x == 0) p.count[t] = visible;
    return;
  }
  const float* sc = p.scores + static_cast<int64_t>(t) * p.max_keys;

  // The top_k-th largest key, 8 bits at a time.
  uint32_t prefix = 0, mask = 0;
  int remaining = p.top_k;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int e = threadIdx.x; e < visible; e += blockDim.x) {
      const uint32_t u = OrderedKey(sc[e]);
      if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 255u], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0;
      for (int d = 255; d >= 0; --d) {
        if (above + hist[d] >= remaining) {
          s_prefix = prefix | (static_cast<uint32_t>(d) << shift);
          s_remaining = remaining - above;
          break;
        }
        above += hist[d];
      }
      s_above = 0;
      s_taken = 0;
    }
    __syncthreads();
    prefix = s_prefix;
    remaining = s_remaining;
    mask |= 255u << shift;
  }
  // Every key above the threshold, then the earliest `remaining` equal to it.
  const int above = p.top_k - remaining;
  for (int e = threadIdx.x; e < visible; e += blockDim.x) {
    if (OrderedKey(sc[e]) > prefix) sel[atomicAdd(&s_above, 1)] = e;
  }
  for (int base = 0; base < visible; base += blockDim.x) {
    const int e = base + threadIdx.x;
    const bool eq = e < visible && OrderedKey(sc[e]) == prefix;
    const unsigned ballot = __ballot_sync(kFull, eq);
    if (lane == 0) warp_cnt[warp] = __popc(ballot);
    __syncthreads();
    int rank = s_taken + __popc(ballot & ((1u << lane) - 1u));
    for (int v = 0; v < warp; ++v) rank += warp_cnt[v];
    if (eq && rank < remaining) sel[above + rank] = e;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int v = 0; v < kThreads / 32; ++v) s_taken += warp_cnt[v];
    }
    __syncthreads();
    if (s_taken >= remaining) break;  // block-uniform
  }
  if (threadIdx.x == 0) p.count[t] = p.top_k;
}

__global__ void __launch_bounds__(kThreads) IndexKeyKernel(IndexKeyParams p) {
  PdlBegin();
  extern __shared__ float k[];
  __shared__ float scratch[32];
  const int t = blockIdx.x;
  const int slot = p.slot_mapping[t];
  if (slot < 0) return;  // block-uniform
  const bf16* src = p.src + static_cast<int64_t>(t) * p.ld_src;
  float sum = 0.0f;
  for (int i = threadIdx.x; i < p.dim; i += blockDim.x) {
    k[i] = __bfloat162float(src[i]);
    sum += k[i];
  }
  const float mean = BlockSum(sum, scratch) / static_cast<float>(p.dim);
  float var = 0.0f;
  for (int i = threadIdx.x; i < p.dim; i += blockDim.x) var += (k[i] - mean) * (k[i] - mean);
  const float inv = 1.0f / sqrtf(BlockSum(var, scratch) / static_cast<float>(p.dim) + p.eps);
  for (int i = threadIdx.x; i < p.dim; i += blockDim.x)
    k[i] = (k[i] - mean) * inv * p.weight[i] + p.bias[i];
  __syncthreads();
  const int half = p.rope.dim / 2;
  const bool interleaved = p.rope.layout == RopeLayout::kInterleaved;
  const int position = p.positions[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float2 v = RopeRotate(make_float2(k[a], k[b]),
                                RopeCosSin(p.rope.inv_freq, p.rope.attention_factor, i, position));
    k[a] = v.x;
    k[b] = v.y;
  }
  __syncthreads();
  bf16* dst = p.cache + static_cast<int64_t>(slot) * p.row_width + p.offset;
  for (int i = threadIdx.x; i < p.dim; i += blockDim.x) dst[i] = __float2bfloat16_rn(k[i]);
}

__global__ void __launch_bounds__(kThreads) SelectedRowsKernel(SelectedRowsParams p) {
  PdlBegin();
  const int t = blockIdx.x;
  const int n = p.count[t];
  const int32_t* sel = p.selected + static_cast<int64_t>(t) * p.top_k;
  const int32_t* bt = p.block_table + static_cast<int64_t>(t) * p.max_blocks_per_seq;
  int32_t* out = p.rows + static_cast<int64_t>(t) * p.stride;
  for (int j = threadIdx.x; j < p.stride; j += blockDim.x) {
    out[j] = j < n ? bt[sel[j] / kKvBlockSize] * kKvBlockSize + sel[j] % kKvBlockSize : 0;
  }
}

}  // namespace

absl::Status RunSelectedRows(const SelectedRowsParams& p) {
  if (p.num_tokens < 0 || p.top_k < 1 || p.stride < p.top_k || p.max_blocks_per_seq < 1) {
    return absl::InvalidArgumentError("RunSelectedRows: need stride >= top_k >= 1");
  }
  if (!p.selected || !p.count || !p.block_table || !p.rows) {
    return absl::InvalidArgumentError("RunSelectedRows: null pointer");
  }
  if (p.num_tokens == 0) return absl::OkStatus();
  RETURN_IF_ERROR(
      LaunchPdl("SelectedRowsKernel", SelectedRowsKernel, p.num_tokens, kThreads, 0, p.stream, p));
  return LaunchStatus("SelectedRowsKernel");
}

absl::Status RunIndexer(const IndexerParams& p) {
  if (p.num_heads < 1 || p.num_heads > kMaxHeads || p.head_dim < 1 ||
      p.num_heads * p.head_dim > 8192 || p.top_k < 1 || p.rate < 1 || p.num_tokens < 0 ||
      p.ldw < p.num_heads || p.max_keys < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunIndexer: need 1 <= num_heads <= ", kMaxHeads,
                     ", num_heads * head_dim <= 8192, top_k >= 1, ldw >= num_heads"));
  }
  if (p.num_tokens > 65535)
    return absl::InvalidArgumentError("RunIndexer: at most 65535 tokens a call");
  if (!p.q || !p.w || !p.seq_lens || !p.scores || !p.selected || !p.count || !p.key_cache ||
      !p.block_table || p.key_offset + p.head_dim > p.key_row_width) {
    return absl::InvalidArgumentError("RunIndexer: null pointer, or the key outside its cache row");
  }
  if (p.tensor_cores &&
      (p.num_heads != kMmaHeads || p.head_dim != kMmaDim || p.key_row_width % 8 != 0 ||
       p.key_offset % 8 != 0 || reinterpret_cast<uintptr_t>(p.key_cache) % 16 != 0 ||
       reinterpret_cast<uintptr_t>(p.q) % 16 != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunIndexer: the tensor-core scores are built for ", kMmaHeads, " heads of ", kMmaDim,
        " dims, 16-byte aligned q and keys (row width and offset multiples of 8)"));
  }
  if (p.num_tokens == 0) return absl::OkStatus();
  const dim3 grid((p.max_keys + kThreads - 1) / kThreads, p.num_tokens);
  if (p.tensor_cores) {
    RETURN_IF_ERROR(AllowDynamicSmem<IndexScoreMmaKernel>(static_cast<int>(sizeof(IndexMmaSmem))));
    RETURN_IF_ERROR(LaunchPdl("IndexScoreMmaKernel", IndexScoreMmaKernel, grid, kThreads,
                              sizeof(IndexMmaSmem), p.stream, p));
    RETURN_IF_ERROR(LaunchStatus("IndexScoreMmaKernel"));
  } else {
    const size_t smem =
        (static_cast<size_t>(p.num_heads) * p.head_dim + p.num_heads) * sizeof(float);
    if (smem > 48 * 1024) {
      RETURN_IF_CUDA_ERROR(cudaFuncSetAttribute(
          IndexScoreKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    }
    RETURN_IF_ERROR(
        LaunchPdl("IndexScoreKernel", IndexScoreKernel, grid, kThreads, smem, p.stream, p));
    RETURN_IF_ERROR(LaunchStatus("IndexScoreKernel"));
  }
  RETURN_IF_ERROR(
      LaunchPdl("IndexSelectKernel", IndexSelectKernel, p.num_tokens, kThreads, 0, p.stream, p));
  return LaunchStatus("IndexSelectKernel");
}

absl::Status RunIndexKey(const IndexKeyParams& p) {
  if (p.dim < 2 || p.dim > 1024 || p.rope.dim < 0 || p.rope.dim > p.dim || p.rope.dim % 2 != 0 ||
      p.offset < 0 || p.offset + p.dim > p.row_width || p.ld_src < p.dim || p.num_tokens < 0) {
    return absl::InvalidArgumentError(
        "RunIndexKey: need rope dim <= dim <= 1024, offset + dim <= row_width");
  }
  if (!p.src || !p.weight || !p.bias || !p.positions || !p.slot_mapping || !p.cache ||
      !p.rope.inv_freq) {
    return absl::InvalidArgumentError("RunIndexKey: null pointer");
  }
  if (p.num_tokens == 0) return absl::OkStatus();
  RETURN_IF_ERROR(LaunchPdl("IndexKeyKernel", IndexKeyKernel, p.num_tokens, kThreads,
                            p.dim * sizeof(float), p.stream, p));
  return LaunchStatus("IndexKeyKernel");
}

}  // namespace moesh::cuda
