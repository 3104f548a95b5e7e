// DeepSeek-V4's ops (v4_ops.h states the math of each; the CPU references are
// kernels/cpu/mhc.cc and common/model/v4/v4_model.cc). RoPE: rope.cuh's, on
// interleaved pairs.
#include <algorithm>
#include <cfloat>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/v4_ops.h"

namespace moesh::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxHc = 8;
constexpr int kKeyTile = 16;  // attention keys staged in shared memory at a time

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float2 CosSin(const RopeTableView& r, int i, int position) {
  return RopeCosSin(r.inv_freq, r.attention_factor, i, position);
}

// Ropes the trailing rope.dim values of the dim values at `x` (shared memory,
// fp32) at `position`; every thread calls it; ends with a barrier.
__device__ void RopeTailShared(float* x, int dim, const RopeTableView& r, int position) {
  const int half = r.dim / 2, first = dim - r.dim;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    float2* pair = reinterpret_cast<float2*>(x + first + 2 * i);
    *pair = RopeRotate(*pair, CosSin(r, i, position));
  }
  __syncthreads();
}

__device__ __forceinline__ int64_t CacheRow(const int32_t* block_table, int token) {
  return static_cast<int64_t>(block_table[token / kKvBlockSize]) * kKvBlockSize +
         token % kKvBlockSize;
}

// ---- mHC ---------------------------------------------------------------

// comb = Sinkhorn(softmax_rows(logits * inv * scale + base) + hc_eps) on one warp:
// entry e = lane + 32 q (q < kSlots; hc * hc <= 32 kSlots) lives in lane
// e % 32, row and column sums by shuffles, added in the serial order (the
// same floats as one thread's loops, without their local-memory array — that
// thread took ~87 us a launch at batch 1, V4-Flash shapes).
template <int kSlots>
__device__ __forceinline__ void MhcSinkhorn(const MhcPreParams& p, int64_t token,
                                            const float* logits, const float* base, float inv,
                                            float scale, int lane) {
  const unsigned all = 0xffffffffu;
  const int hc = p.hc, n = hc * hc;
  float c[kSlots], sum[kSlots];
  const auto at = [&](int e) {  // entry e, from its lane
    float got = 0.0f;
#pragma unroll
    for (int q = 0; q < kSlots; ++q) {
      const float g = __shfl_sync(all, c[q], e & 31);
      if (e >> 5 == q) got = g;
    }
    return got;
  };
  const auto row_sums = [&] {
#pragma unroll
    for (int q = 0; q < kSlots; ++q) {
      const int row = min((lane + 32 * q) / hc, hc - 1);
      sum[q] = 0.0f;
      for (int k = 0; k < hc; ++k) sum[q] += at(row * hc + k);
    }
  };
  const auto column_sums = [&] {
#pragma unroll
    for (int q = 0; q < kSlots; ++q) {
      const int col = (lane + 32 * q) % hc;
      sum[q] = 0.0f;
      for (int j = 0; j < hc; ++j) sum[q] += at(j * hc + col);
    }
  };
#pragma unroll
  for (int q = 0; q < kSlots; ++q) {
    const int e = lane + 32 * q;
    c[q] = e < n ? logits[e] * inv * scale + base[e] : 0.0f;
  }
#pragma unroll
  for (int q = 0; q < kSlots; ++q) {  // softmax over each row
    const int row = min((lane + 32 * q) / hc, hc - 1);
    float mx = -FLT_MAX;
    for (int k = 0; k < hc; ++k) mx = fmaxf(mx, at(row * hc + k));
    sum[q] = mx;
  }
#pragma unroll
  for (int q = 0; q < kSlots; ++q) c[q] = expf(c[q] - sum[q]);
  row_sums();
#pragma unroll
  for (int q = 0; q < kSlots; ++q) c[q] = c[q] / sum[q] + p.hc_eps;
  column_sums();
#pragma unroll
  for (int q = 0; q < kSlots; ++q) c[q] /= sum[q] + p.hc_eps;
  for (int it = 1; it < p.sinkhorn_iters; ++it) {
    row_sums();
#pragma unroll
    for (int q = 0; q < kSlots; ++q) c[q] /= sum[q] + p.hc_eps;
    column_sums();
#pragma unroll
    for (int q = 0; q < kSlots; ++q) c[q] /= sum[q] + p.hc_eps;
  }
#pragma unroll
  for (int q = 0; q < kSlots; ++q) {
    if (lane + 32 * q < n) p.comb[token * n + lane + 32 * q] = c[q];
  }
}

// The mapping's inputs go to shared memory first (one parallel load); warp 0
// then maps them (MhcSinkhorn for comb). kVec: x and collapsed read and
// written as float4 (hidden % 4 == 0, both 16-byte aligned). One CTA of
// kMhcThreads a token: at batch 1 its loads of x set the pace (51 us a launch
// with 256 threads and scalar loads, V4-Flash shapes).
constexpr int kMhcThreads = 1024;
template <bool kVec>
__global__ void __launch_bounds__(kMhcThreads) MhcPreKernel(MhcPreParams p) {
  PdlBegin();
  __shared__ float scratch[32];
  __shared__ float pre[kMaxHc];
  __shared__ float m[(2 + kMaxHc) * kMaxHc], base[(2 + kMaxHc) * kMaxHc], scale[3];
  const int64_t i = blockIdx.x;
  const int64_t r = p.rows != nullptr ? p.rows[i] : i;
  const int hc = p.hc, width = hc * p.hidden;
  const int n_mix = p.head ? hc : (2 + hc) * hc;
  const float* x = p.x + r * width;
  for (int j = threadIdx.x; j < n_mix; j += blockDim.x) {
    m[j] = p.mix[r * n_mix + j];
    base[j] = p.base[j];
  }
  if (threadIdx.x < (p.head ? 1 : 3)) scale[threadIdx.x] = p.scale[threadIdx.x];
  float ss = 0.0f;
  if constexpr (kVec) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
#pragma unroll 4
    for (int j = threadIdx.x; j < width / 4; j += blockDim.x) {
      const float4 v = x4[j];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int j = threadIdx.x; j < width; j += blockDim.x) ss += x[j] * x[j];
  }
  const float inv = 1.0f / sqrtf(BlockSum(ss, scratch) / static_cast<float>(width) + p.norm_eps);
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    if (lane < hc) pre[lane] = Sigmoid(m[lane] * inv * scale[0] + base[lane]) + p.hc_eps;
    if (!p.head) {
      if (lane < hc) {
        p.post[i * hc + lane] = 2.0f * Sigmoid(m[hc + lane] * inv * scale[1] + base[hc + lane]);
      }
      const float* logits = m + 2 * hc;  // comb's, before the scale
      if (hc * hc <= 32) {
        MhcSinkhorn<1>(p, i, logits, base + 2 * hc, inv, scale[2], lane);
      } else {
        MhcSinkhorn<2>(p, i, logits, base + 2 * hc, inv, scale[2], lane);
      }
    }
  }
  __syncthreads();
  float* out = p.collapsed + i * p.hidden;
  if constexpr (kVec) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int h4 = p.hidden / 4;
#pragma unroll 4
    for (int d = threadIdx.x; d < h4; d += blockDim.x) {
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int j = 0; j < hc; ++j) {
        const float4 v = x4[static_cast<int64_t>(j) * h4 + d];
        acc.x += pre[j] * v.x, acc.y += pre[j] * v.y, acc.z += pre[j] * v.z, acc.w += pre[j] * v.w;
      }
      reinterpret_cast<float4*>(out)[d] = acc;
    }
  } else {
    for (int d = threadIdx.x; d < p.hidden; d += blockDim.x) {
      float acc = 0.0f;
      for (int j = 0; j < hc; ++j) acc += pre[j] * x[static_cast<int64_t>(j) * p.hidden + d];
      out[d] = acc;
    }
  }
}

__global__ void __launch_bounds__(kThreads) MhcPostKernel(MhcPostParams p) {
  PdlBegin();
  const int64_t n = static_cast<int64_t>(p.num_tokens) * p.hidden;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / p.hidden;
    const int d = static_cast<int>(idx % p.hidden);
    float* xt = p.x + t * p.hc * p.hidden + d;
    float xs[kMaxHc];
#pragma unroll
    for (int j = 0; j < kMaxHc; ++j)
      xs[j] = j < p.hc ? xt[static_cast<int64_t>(j) * p.hidden] : 0.0f;
    const float y = p.y[idx];
    const float* post = p.post + t * p.hc;
    const float* comb = p.comb + t * p.hc * p.hc;
    for (int k = 0; k < p.hc; ++k) {
      float acc = post[k] * y;
#pragma unroll
      for (int j = 0; j < kMaxHc; ++j) {
        if (j < p.hc) acc += comb[j * p.hc + k] * xs[j];
      }
      xt[static_cast<int64_t>(k) * p.hidden] = acc;
    }
  }
}

// ---- attention inputs ------------------------------------------------------

// One warp per (token, head); lane l holds pairs l, l + 32, ...
__global__ void __launch_bounds__(kThreads) V4HeadsKernel(V4HeadsParams p) {
  PdlBegin();
  constexpr int kMaxPairs = 16;  // dim <= 1024
  const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int half = p.dim / 2, first = (p.dim - p.rope.dim) / 2;
  const int position = p.seq_lens[t] - 1;
  // Grid (tokens, heads / kWarps): a warp per head (at batch 1 one CTA
  // looping over the heads took 18 us a launch).
  if (const int r = static_cast<int>(blockIdx.y) * kWarps + warp; r < p.num_heads) {
    __nv_bfloat162* x = reinterpret_cast<__nv_bfloat162*>(p.x + static_cast<int64_t>(t) * p.ldx +
                                                          static_cast<int64_t>(r) * p.dim);
    float2 v[kMaxPairs];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxPairs; ++k) {
      const int i = lane + 32 * k;
      v[k] = i < half ? __bfloat1622float2(x[i]) : make_float2(0.0f, 0.0f);
      ss += v[k].x * v[k].x + v[k].y * v[k].y;
    }
    const float inv =
        p.normalize ? 1.0f / sqrtf(WarpSum(ss) / static_cast<float>(p.dim) + p.eps) : 1.0f;
#pragma unroll
    for (int k = 0; k < kMaxPairs; ++k) {
      const int i = lane + 32 * k;
      if (i >= half) continue;
      float2 o = make_float2(v[k].x * inv, v[k].y * inv);
      if (i >= first) o = RopeRotate(o, CosSin(p.rope, i - first, position));
      x[i] = __floats2bfloat162_rn(o.x, o.y);
    }
  }
}

__global__ void __launch_bounds__(kThreads) V4KvRowKernel(V4KvRowParams p) {
  PdlBegin();
  extern __shared__ float row[];
  __shared__ float scratch[32];
  const int t = blockIdx.x;
  const int slot = p.slot_mapping[t];
  if (slot < 0) return;  // block-uniform
  const bf16* src = p.src + static_cast<int64_t>(t) * p.ld_src;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < p.width; j += blockDim.x) {
    const float v = __bfloat162float(src[j]);
    row[j] = v;
    if (j < p.head_dim) ss += v * v;
  }
  const float inv = 1.0f / sqrtf(BlockSum(ss, scratch) / static_cast<float>(p.head_dim) + p.eps);
  for (int j = threadIdx.x; j < p.head_dim; j += blockDim.x)
    row[j] = __bfloat162float(p.kv_norm[j]) * (row[j] * inv);
  __syncthreads();
  RopeTailShared(row, p.head_dim, p.rope, p.seq_lens[t] - 1);
  bf16* dst = p.cache + static_cast<int64_t>(slot) * p.row_width;
  for (int j = threadIdx.x; j < p.width; j += blockDim.x) dst[j] = __float2bfloat16_rn(row[j]);
}

// One block per (new entry, segment); thread f pools feature f (and f + blockDim...).
__global__ void __launch_bounds__(kThreads) V4CompressKernel(V4CompressParams p) {
  PdlBegin();
  extern __shared__ float entry[];
  __shared__ float scratch[32];
  const int s = blockIdx.y;
  const int row = p.seg_row[s];
  const int e = p.seg_from[s] / p.rate + static_cast<int>(blockIdx.x);
  if (e >= p.seq_lens[row] / p.rate) return;  // block-uniform
  const int32_t* bt = p.block_table + static_cast<int64_t>(row) * p.max_blocks_per_seq;
  const int cd = p.series * p.dim;
  float ss = 0.0f;
  for (int f = threadIdx.x; f < p.dim; f += blockDim.x) {
    float mx = -FLT_MAX, sum = 0.0f, acc = 0.0f;
    auto add = [&](int token, int slot, int feature) {
      const bf16* r = p.cache + CacheRow(bt, token) * p.row_width;
      const float v = __bfloat162float(r[p.kv_offset + feature]);
      const float g = __bfloat162float(r[p.gate_offset + feature]) +
                      p.ape[static_cast<int64_t>(slot) * cd + feature];
      if (g > mx) {
        const float corr = expf(mx - g);
        sum *= corr;
        acc *= corr;
        mx = g;
      }
      const float w = expf(g - mx);
      sum += w;
      acc += w * v;
    };
    if (p.series == 2 && e > 0) {
      for (int j = 0; j < p.rate; ++j) add((e - 1) * p.rate + j, j, f);
    }
    for (int j = 0; j < p.rate; ++j) add(e * p.rate + j, j, p.series == 2 ? p.dim + f : f);
    const float v = acc / sum;
    entry[f] = v;
    ss += v * v;
  }
  const float inv = 1.0f / sqrtf(BlockSum(ss, scratch) / static_cast<float>(p.dim) + p.eps);
  for (int f = threadIdx.x; f < p.dim; f += blockDim.x)
    entry[f] = __bfloat162float(p.norm[f]) * (entry[f] * inv);
  __syncthreads();
  RopeTailShared(entry, p.dim, p.rope, e * p.rate);
  bf16* out = p.entries + CacheRow(bt, e) * p.entry_row_width + p.entry_offset;
  for (int f = threadIdx.x; f < p.dim; f += blockDim.x) out[f] = __float2bfloat16_rn(entry[f]);
}

// The keys token t attends to, in order: its window's cache rows, then its
// sequence's entries (none, all visible, or the selected); Key(j) is key j's
// first value. A padding row (length 0) has none.
struct V4KeyList {
  const V4AttentionParams& p;
  const int32_t* bt;
  const int32_t* sel;
  int n_win, win_first, total;
  __device__ V4KeyList(const V4AttentionParams& params, int t) : p(params) {
    const int len = p.seq_lens[t];
    bt = p.block_table + static_cast<int64_t>(t) * p.max_blocks_per_seq;
    sel = p.selected != nullptr ? p.selected + static_cast<int64_t>(t) * p.top_k : nullptr;
    n_win = len > 0 ? min(p.window, len) : 0;
    win_first = len - n_win;
    const int n_ent = len == 0 || p.keys == V4Keys::kSlidingOnly ? 0
                      : p.keys == V4Keys::kAllEntries            ? len / p.rate
                                                                 : p.count[t];
    total = n_win + n_ent;
  }
  __device__ const bf16* Key(int j) const {
    if (j < n_win) return p.cache + CacheRow(bt, win_first + j) * p.row_width;
    const int e = p.keys == V4Keys::kSelectedEntries ? sel[j - n_win] : j - n_win;
    return p.entries + CacheRow(bt, e) * p.entry_row_width;
  }
};

// Block (token, 8 heads), a warp per head; keys staged kKeyTile at a time in
// shared memory as fp32; online softmax started from the sink.
template <int kPairs>
__global__ void __launch_bounds__(kThreads) V4AttentionKernel(V4AttentionParams p) {
  PdlBegin();
  extern __shared__ float keys_smem[];  // [kKeyTile, dim]
  const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int head = blockIdx.y * kWarps + warp;
  const bool active = head < p.num_heads;
  const int dim = p.dim, half = dim / 2;
  const int len = p.seq_lens[t];
  __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(
      p.out + (static_cast<int64_t>(t) * p.num_heads + head) * dim);
  if (len == 0) {  // a padding row; block-uniform
    if (active) {
      for (int i = lane; i < half; i += 32) out[i] = __floats2bfloat162_rn(0.0f, 0.0f);
    }
    return;
  }
  const int pos = len - 1;
  float2 q[kPairs], o[kPairs];
  if (active) {
    const __nv_bfloat162* qh = reinterpret_cast<const __nv_bfloat162*>(
        p.q + (static_cast<int64_t>(t) * p.num_heads + head) * dim);
#pragma unroll
    for (int k = 0; k < kPairs; ++k) {
      const int i = lane + 32 * k;
      q[k] = i < half ? __bfloat1622float2(qh[i]) : make_float2(0.0f, 0.0f);
      o[k] = make_float2(0.0f, 0.0f);
    }
  }
  float mx = active ? p.sinks[head] : 0.0f, sum = 1.0f;  // the sink's exp(sink - mx)
  const V4KeyList keys(p, t);
  for (int base = 0; base < keys.total; base += kKeyTile) {
    const int n = min(kKeyTile, keys.total - base);
    __syncthreads();  // the previous tile is read
    for (int i = threadIdx.x; i < n * dim; i += blockDim.x) {
      keys_smem[i] = __bfloat162float(keys.Key(base + i / dim)[i % dim]);
    }
    __syncthreads();
    if (!active) continue;
    for (int kk = 0; kk < n; ++kk) {
      const float2* key = reinterpret_cast<const float2*>(keys_smem + kk * dim);
      float dot = 0.0f;
#pragma unroll
      for (int k = 0; k < kPairs; ++k) {
        const int i = lane + 32 * k;
        if (i < half) dot += q[k].x * key[i].x + q[k].y * key[i].y;
      }
      const float logit = WarpSum(dot) * p.scale;
      if (logit > mx) {
        const float corr = expf(mx - logit);
        sum *= corr;
#pragma unroll
        for (int k = 0; k < kPairs; ++k) o[k] = make_float2(o[k].x * corr, o[k].y * corr);
        mx = logit;
      }
      const float w = expf(logit - mx);
      sum += w;
#pragma unroll
      for (int k = 0; k < kPairs; ++k) {
        const int i = lane + 32 * k;
        if (i < half) o[k] = make_float2(o[k].x + w * key[i].x, o[k].y + w * key[i].y);
      }
    }
  }
  if (!active) return;
  const int rope_first = (dim - p.rope.dim) / 2;
  const float inv = 1.0f / sum;
#pragma unroll
  for (int k = 0; k < kPairs; ++k) {
    const int i = lane + 32 * k;
    if (i >= half) continue;
    float2 v = make_float2(o[k].x * inv, o[k].y * inv);
    if (i >= rope_first) v = RopeRotate(v, CosSin(p.rope, i - rope_first, -pos));
    out[i] = __floats2bfloat162_rn(v.x, v.y);
  }
}

// A CTA per (8 rows, token); a row is out_width / 8 chunks of 8 values.
__global__ void __launch_bounds__(kThreads)
    V4GatherKeysKernel(V4AttentionParams p, int first, int stride, int out_width, bf16* keys,
                       int32_t* key_count) {
  PdlBegin();
  constexpr int kRows = 8;
  const int i = blockIdx.y, t = first + i;
  const V4KeyList list(p, t);
  if (blockIdx.x == 0 && threadIdx.x == 0) key_count[t] = list.total;
  const int chunks = out_width / 8, key_chunks = p.dim / 8;
  for (int c = threadIdx.x; c < kRows * chunks; c += blockDim.x) {
    const int j = blockIdx.x * kRows + c / chunks, k = c % chunks;
    if (j >= list.total) continue;
    uint4* dst =
        reinterpret_cast<uint4*>(keys + (static_cast<int64_t>(i) * stride + j) * out_width) + k;
    *dst = k < key_chunks ? reinterpret_cast<const uint4*>(list.Key(j))[k] : make_uint4(0, 0, 0, 0);
  }
}

// A warp per (token, head); lane l holds pairs l, l + 32, ...
__global__ void __launch_bounds__(kThreads) V4AttnFinishKernel(V4AttnFinishParams p) {
  PdlBegin();
  const int t = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int half = p.dim / 2, rope_first = (p.dim - p.rope.dim) / 2;
  const int len = p.seq_lens[t];
  // Grid (tokens, heads / kWarps): a warp per head.
  if (const int h = static_cast<int>(blockIdx.y) * kWarps + warp; h < p.num_heads) {
    const int64_t row = static_cast<int64_t>(t) * p.num_heads + h;
    const float2* o = reinterpret_cast<const float2*>(p.o + row * p.dim);
    __nv_bfloat162* out = reinterpret_cast<__nv_bfloat162*>(p.out + row * p.dim);
    const float keep = len > 0 ? 1.0f / (1.0f + expf(p.sinks[h] - p.lse[row])) : 0.0f;
    for (int i = lane; i < half; i += 32) {
      float2 v = len > 0 ? o[i] : make_float2(0.0f, 0.0f);
      v = make_float2(v.x * keep, v.y * keep);
      if (i >= rope_first && len > 0) v = RopeRotate(v, CosSin(p.rope, i - rope_first, -(len - 1)));
      out[i] = __floats2bfloat162_rn(v.x, v.y);
    }
  }
}

absl::Status CheckRope(const RopeTableView& r, int dim, const char* op) {
  if (r.inv_freq == nullptr || r.dim < 0 || r.dim % 2 != 0 || r.dim > dim ||
      r.layout != RopeLayout::kInterleaved) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": the rope table must be interleaved, of even width <= ", dim, " (", r.dim, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunMhcPre(const MhcPreParams& p) {
  if (p.hc < 1 || p.hc > kMaxHc || p.hidden < 1 || p.num_tokens < 0 || p.sinkhorn_iters < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunMhcPre: need 1 <= hc <= ", kMaxHc, ", hidden >= 1, sinkhorn_iters >= 1"));
  }
  if (!p.x || !p.mix || !p.base || !p.scale || !p.collapsed || (!p.head && (!p.post || !p.comb))) {
    return absl::InvalidArgumentError("RunMhcPre: null pointer");
  }
  if (p.num_tokens == 0) return absl::OkStatus();
  if (p.hidden % 4 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(p.collapsed) % 16 == 0) {
    RETURN_IF_ERROR(
        LaunchPdl("MhcPreKernel", MhcPreKernel<true>, p.num_tokens, kMhcThreads, 0, p.stream, p));
  } else {
    RETURN_IF_ERROR(
        LaunchPdl("MhcPreKernel", MhcPreKernel<false>, p.num_tokens, kMhcThreads, 0, p.stream, p));
  }
  return LaunchStatus("MhcPreKernel");
}

absl::Status RunMhcPost(const MhcPostParams& p) {
  if (p.hc < 1 || p.hc > kMaxHc || p.hidden < 1 || p.num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunMhcPost: need 1 <= hc <= ", kMaxHc, ", hidden >= 1"));
  }
  if (!p.x || !p.y || !p.post || !p.comb)
    return absl::InvalidArgumentError("RunMhcPost: null pointer");
  if (p.num_tokens == 0) return absl::OkStatus();
  const int64_t n = static_cast<int64_t>(p.num_tokens) * p.hidden;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
  RETURN_IF_ERROR(LaunchPdl("MhcPostKernel", MhcPostKernel, blocks, kThreads, 0, p.stream, p));
  return LaunchStatus("MhcPostKernel");
}

absl::Status RunV4Heads(const V4HeadsParams& p) {
  if (p.dim < 2 || p.dim % 2 != 0 || p.dim > 1024 || p.num_heads < 1 ||
      p.ldx < p.num_heads * p.dim || p.ldx % 2 != 0 || p.num_tokens < 0) {
    return absl::InvalidArgumentError(
        "RunV4Heads: need an even dim <= 1024 and ldx >= num_heads * dim, even");
  }
  RETURN_IF_ERROR(CheckRope(p.rope, p.dim, "RunV4Heads"));
  if (!p.x || !p.seq_lens) return absl::InvalidArgumentError("RunV4Heads: null pointer");
  if (p.num_tokens == 0) return absl::OkStatus();
  const dim3 grid(p.num_tokens, (p.num_heads + kWarps - 1) / kWarps);
  RETURN_IF_ERROR(LaunchPdl("V4HeadsKernel", V4HeadsKernel, grid, kThreads, 0, p.stream, p));
  return LaunchStatus("V4HeadsKernel");
}

absl::Status RunV4KvRow(const V4KvRowParams& p) {
  if (p.width < p.head_dim || p.width > p.row_width || p.width > 4096 || p.head_dim < 2 ||
      p.ld_src < p.width || p.num_tokens < 0) {
    return absl::InvalidArgumentError(
        "RunV4KvRow: need head_dim <= width <= min(row_width, 4096), ld_src >= width");
  }
  RETURN_IF_ERROR(CheckRope(p.rope, p.head_dim, "RunV4KvRow"));
  if (!p.src || !p.kv_norm || !p.seq_lens || !p.slot_mapping || !p.cache) {
    return absl::InvalidArgumentError("RunV4KvRow: null pointer");
  }
  if (p.num_tokens == 0) return absl::OkStatus();
  RETURN_IF_ERROR(LaunchPdl("V4KvRowKernel", V4KvRowKernel, p.num_tokens, kThreads,
                            p.width * sizeof(float), p.stream, p));
  return LaunchStatus("V4KvRowKernel");
}

absl::Status RunV4Compress(const V4CompressParams& p) {
  if ((p.series != 1 && p.series != 2) || p.dim < 2 || p.dim > 1024 || p.rate < 1 ||
      p.num_segs < 0 || p.max_new < 0 || p.num_segs > 65535) {
    return absl::InvalidArgumentError(
        "RunV4Compress: need series 1 or 2, 2 <= dim <= 1024, rate >= 1");
  }
  RETURN_IF_ERROR(CheckRope(p.rope, p.dim, "RunV4Compress"));
  if (!p.cache || !p.block_table || !p.seq_lens || !p.seg_row || !p.seg_from || !p.ape || !p.norm ||
      !p.entries || p.entry_offset + p.dim > p.entry_row_width) {
    return absl::InvalidArgumentError("RunV4Compress: null pointer, or the entry outside its row");
  }
  if (p.num_segs == 0 || p.max_new == 0) return absl::OkStatus();
  const dim3 grid(p.max_new, p.num_segs);
  RETURN_IF_ERROR(LaunchPdl("V4CompressKernel", V4CompressKernel, grid, 128, p.dim * sizeof(float),
                            p.stream, p));
  return LaunchStatus("V4CompressKernel");
}

absl::Status RunV4Attention(const V4AttentionParams& p) {
  if (p.dim < 2 || p.dim % 2 != 0 || p.dim > 512 || p.num_heads < 1 || p.num_tokens < 0 ||
      p.window < 1 || p.rate < 1 || p.row_width < p.dim) {
    return absl::InvalidArgumentError(
        "RunV4Attention: need an even dim <= 512 <= row_width, window, rate >= 1");
  }
  RETURN_IF_ERROR(CheckRope(p.rope, p.dim, "RunV4Attention"));
  if (!p.q || !p.cache || !p.block_table || !p.seq_lens || !p.sinks || !p.out ||
      (p.keys != V4Keys::kSlidingOnly && (!p.entries || p.entry_row_width < p.dim)) ||
      (p.keys == V4Keys::kSelectedEntries && (!p.selected || !p.count || p.top_k < 1))) {
    return absl::InvalidArgumentError("RunV4Attention: null pointer");
  }
  if (p.num_tokens == 0) return absl::OkStatus();
  const dim3 grid(p.num_tokens, (p.num_heads + kWarps - 1) / kWarps);
  const size_t smem = static_cast<size_t>(kKeyTile) * p.dim * sizeof(float);
  const int pairs = (p.dim / 2 + 31) / 32;
  absl::Status st;
  DispatchUpTo<1, 2, 4, 8>(pairs, [&](auto k) {
    st.Update(LaunchPdl("V4AttentionKernel", V4AttentionKernel<decltype(k)::value>, grid, kThreads,
                        smem, p.stream, p));
  });
  return st;
}

absl::Status RunV4GatherKeys(const V4AttentionParams& a, int first, int n, int stride,
                             int out_width, bf16* keys, int32_t* key_count) {
  if (a.dim % 8 != 0 || out_width < a.dim || out_width % 8 != 0 || first < 0 || n < 0 ||
      stride < 1 || n > 65535) {
    return absl::InvalidArgumentError(
        "RunV4GatherKeys: need dim % 8 == 0, out_width >= dim and % 8 == 0");
  }
  if (!a.cache || !a.block_table || !a.seq_lens || !keys || !key_count ||
      (a.keys != V4Keys::kSlidingOnly && (!a.entries || a.entry_row_width % 8 != 0)) ||
      (a.keys == V4Keys::kSelectedEntries && (!a.selected || !a.count))) {
    return absl::InvalidArgumentError("RunV4GatherKeys: null pointer");
  }
  if (n == 0) return absl::OkStatus();
  const dim3 grid((stride + 7) / 8, n);
  RETURN_IF_ERROR(LaunchPdl("V4GatherKeysKernel", V4GatherKeysKernel, grid, kThreads, 0, a.stream,
                            a, first, stride, out_width, keys, key_count));
  return LaunchStatus("V4GatherKeysKernel");
}

absl::Status RunV4AttnFinish(const V4AttnFinishParams& p) {
  if (p.dim < 2 || p.dim % 2 != 0 || p.num_heads < 1 || p.num_tokens < 0) {
    return absl::InvalidArgumentError("RunV4AttnFinish: need an even dim, num_heads >= 1");
  }
  RETURN_IF_ERROR(CheckRope(p.rope, p.dim, "RunV4AttnFinish"));
  if (!p.o || !p.lse || !p.sinks || !p.seq_lens || !p.out)
    return absl::InvalidArgumentError("RunV4AttnFinish: null pointer");
  if (p.num_tokens == 0) return absl::OkStatus();
  const dim3 grid(p.num_tokens, (p.num_heads + kWarps - 1) / kWarps);
  RETURN_IF_ERROR(
      LaunchPdl("V4AttnFinishKernel", V4AttnFinishKernel, grid, kThreads, 0, p.stream, p));
  return LaunchStatus("V4AttnFinishKernel");
}

}  // namespace moesh::cuda
