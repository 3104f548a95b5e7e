// Embedding, fp32-residual RMSNorm, slice copy, row gathers (an expert's
// rows; a sequence's latent rows), MoE permute / combine and the plain MLA
// attention kernel (model_ops.h states the math of each).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8_kv.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/pdl.cuh"

namespace moesh::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) EmbedKernel(EmbedParams p) {
  PdlBegin();
  const int64_t t = blockIdx.x;
  const bf16* src = p.table + static_cast<int64_t>(p.token_ids[t]) * p.hidden;
  float* dst = p.out + t * p.copies * p.hidden;
  for (int i = threadIdx.x; i < p.hidden; i += blockDim.x) {
    const float v = __bfloat162float(src[i]);
    for (int j = 0; j < p.copies; ++j) dst[static_cast<int64_t>(j) * p.hidden + i] = v;
  }
}

__global__ void __launch_bounds__(kThreads) RmsNormF32Kernel(RmsNormF32Params p) {
  PdlBegin();
  __shared__ float scratch[32];
  const int64_t i = blockIdx.x;
  const int64_t r = p.rows != nullptr ? p.rows[i] : i;
  const float* x = p.x + r * p.ldx;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < p.n; j += blockDim.x) ss += x[j] * x[j];
  const float inv = 1.0f / sqrtf(BlockSum(ss, scratch) / static_cast<float>(p.n) + p.eps);
  bf16* y = p.y + i * p.n;
  float* y32 = p.y_f32 != nullptr ? p.y_f32 + i * p.n : nullptr;
  for (int j = threadIdx.x; j < p.n; j += blockDim.x) {
    const float v = __bfloat162float(p.weight[j]) * (x[j] * inv);
    y[j] = __float2bfloat16_rn(v);
    if (y32 != nullptr) y32[j] = v;
  }
}

// The same with 16-byte accesses: n % 4 == 0, ldx % 4 == 0, 16-byte aligned x
// and y_f32, 8-byte aligned y.
__global__ void __launch_bounds__(kThreads) RmsNormF32Vec4Kernel(RmsNormF32Params p) {
  PdlBegin();
  __shared__ float scratch[32];
  const int64_t i = blockIdx.x;
  const int64_t r = p.rows != nullptr ? p.rows[i] : i;
  const float4* x = reinterpret_cast<const float4*>(p.x + r * p.ldx);
  const int n4 = p.n / 4;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < n4; j += blockDim.x) {
    const float4 v = x[j];
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  const float inv = 1.0f / sqrtf(BlockSum(ss, scratch) / static_cast<float>(p.n) + p.eps);
  __nv_bfloat162* y = reinterpret_cast<__nv_bfloat162*>(p.y + i * p.n);
  float4* y32 = p.y_f32 != nullptr ? reinterpret_cast<float4*>(p.y_f32 + i * p.n) : nullptr;
  const __nv_bfloat162* w = reinterpret_cast<const __nv_bfloat162*>(p.weight);
  for (int j = threadIdx.x; j < n4; j += blockDim.x) {
    const float4 v = x[j];
    const float2 w0 = __bfloat1622float2(w[2 * j]), w1 = __bfloat1622float2(w[2 * j + 1]);
    const float4 o =
        make_float4(w0.x * (v.x * inv), w0.y * (v.y * inv), w1.x * (v.z * inv), w1.y * (v.w * inv));
    y[2 * j] = __floats2bfloat162_rn(o.x, o.y);
    y[2 * j + 1] = __floats2bfloat162_rn(o.z, o.w);
    if (y32 != nullptr) y32[j] = o;
  }
}

// kVec values (16 bytes with kVec 8) a thread step, over a grid of the whole
// copy (a CTA a token copied 2 bytes a step: 60 us for one token of 64 heads
// of 512, V4-Flash shapes).
template <int kVec>
__global__ void __launch_bounds__(kThreads) SliceCopyKernel(SliceCopyParams p) {
  PdlBegin();
  using Chunk = std::conditional_t<kVec == 8, uint4, bf16>;
  const int chunks = p.dim / kVec;
  const int64_t per_token = static_cast<int64_t>(p.num_rows) * chunks;
  const int64_t n = per_token * p.num_tokens;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = idx / per_token;
    const int rest = static_cast<int>(idx % per_token);
    const int r = rest / chunks, i = (rest % chunks) * kVec;
    *reinterpret_cast<Chunk*>(p.dst + t * p.dst_token_stride +
                              static_cast<int64_t>(r) * p.dst_row_stride + p.dst_offset + i) =
        *reinterpret_cast<const Chunk*>(p.src + t * p.src_token_stride +
                                        static_cast<int64_t>(r) * p.src_row_stride + p.src_offset +
                                        i);
  }
}

// A warp (its `lane`) widens one FP8 KV row's first `width` values into bf16
// (exact: each e4m3 code times its group's power-of-two scale, then the bf16
// part).
__device__ __forceinline__ void WidenFp8Row(const bf16* row, int latent, int width, bf16* out,
                                            int lane) {
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(row);
  for (int d = lane; d < width; d += 32) {
    out[d] = __float2bfloat16_rn(fp8kv::Load(bytes, latent, d));
  }
}

// A warp per row (kThreads / 32 rows per CTA): rows of a few hundred values
// keep every lane busy.
__global__ void __launch_bounds__(kThreads) GatherRowsKernel(GatherRowsParams p) {
  PdlBegin();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const bf16* x = p.x + static_cast<int64_t>(p.index[row]) * p.ldx;
  if (p.fp8_latent > 0)
    return WidenFp8Row(x, p.fp8_latent, p.cols, p.out + row * p.cols, threadIdx.x & 31);
  const Bf16x8* src = reinterpret_cast<const Bf16x8*>(x);
  Bf16x8* dst = reinterpret_cast<Bf16x8*>(p.out + row * p.cols);
  for (int j = threadIdx.x & 31; j < p.cols / 8; j += 32) dst[j] = src[j];
}

// A warp per row, as GatherRowsKernel.
__global__ void __launch_bounds__(kThreads) GatherKvRowsKernel(GatherKvRowsParams p) {
  PdlBegin();
  const int i = blockIdx.x * (kThreads / 32) + (threadIdx.x >> 5);
  if (i >= p.count) return;
  const int pos = p.from + i, lane = threadIdx.x & 31, width = p.latent + p.rope;
  const bf16* row =
      p.cache + (static_cast<int64_t>(p.block_table[pos / kKvBlockSize]) * kKvBlockSize +
                 pos % kKvBlockSize) *
                    p.row_stride;
  bf16* out = p.out + static_cast<int64_t>(i) * p.ldo;
  if (p.dtype == KvCacheDtype::kFp8) return WidenFp8Row(row, p.latent, width, out, lane);
  const Bf16x8* src = reinterpret_cast<const Bf16x8*>(row);
  Bf16x8* dst = reinterpret_cast<Bf16x8*>(out);
  for (int j = lane; j < width / 8; j += 32) dst[j] = src[j];
}

__global__ void __launch_bounds__(kThreads) CopyKvBlocksKernel(CopyKvBlocksParams p) {
  PdlBegin();
  const int64_t layer = blockIdx.y;
  const Bf16x8* src = reinterpret_cast<const Bf16x8*>(
      p.src + layer * p.src_layer_elems +
      static_cast<int64_t>(p.src_blocks[blockIdx.x]) * p.block_elems);
  Bf16x8* dst =
      reinterpret_cast<Bf16x8*>(p.dst + layer * p.dst_layer_elems +
                                static_cast<int64_t>(p.dst_blocks[blockIdx.x]) * p.block_elems);
  for (int64_t j = threadIdx.x; j < p.block_elems / 8; j += blockDim.x) dst[j] = src[j];
}

// Exclusive prefix sum over the block (one value per thread); the total goes
// to *total. REQUIRES: blockDim.x == kPermuteThreads, every thread calls it.
constexpr int kPermuteThreads = 1024;
__device__ int BlockExclusiveScan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += u;
  }
  __syncthreads();  // warp_sums may still be read by an earlier call
  if (lane == 31) warp_sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane];  // 32 warps
    int winc = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, winc, o);
      if (lane >= o) winc += u;
    }
    warp_sums[lane] = winc - w;  // exclusive
    if (lane == 31) *total = winc;
  }
  __syncthreads();
  return warp_sums[warp] + inc - v;
}

__device__ __forceinline__ int PermuteExpert(const MoePermuteParams& p, int i) {
  const int id = p.topk_ids[i];
  if (p.expert_map == nullptr) return id;
  return id >= 0 && id < p.map_size ? p.expert_map[id] : -1;
}

__global__ void __launch_bounds__(kPermuteThreads) MoePermuteKernel(MoePermuteParams p) {
  PdlBegin();
  __shared__ int counts[kPermuteThreads];
  __shared__ int cursor[kPermuteThreads];
  __shared__ int warp_sums[32];
  __shared__ int total_rows, total_tiles;
  const int e = threadIdx.x;
  counts[e] = 0;
  __syncthreads();
  const int pairs = p.num_tokens * p.top_k;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int id = PermuteExpert(p, i);
    if (id >= 0 && id < p.num_experts) atomicAdd(&counts[id], 1);
  }
  __syncthreads();
  const int c = e < p.num_experts ? counts[e] : 0;
  const int row0 = BlockExclusiveScan(c, warp_sums, &total_rows);
  const int tile0 = BlockExclusiveScan((c + p.tile_m - 1) / p.tile_m, warp_sums, &total_tiles);
  if (e < p.num_experts) {
    p.expert_offsets[e] = row0;
    p.tile_offsets[e] = tile0;
    if (p.expert_counts != nullptr) p.expert_counts[e] = c;
  }
  if (e == 0) {
    p.expert_offsets[p.num_experts] = total_rows;
    p.tile_offsets[p.num_experts] = total_tiles;
  }
  cursor[e] = row0;
  __syncthreads();
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int id = PermuteExpert(p, i);
    if (id >= 0 && id < p.num_experts) {
      const int r = atomicAdd(&cursor[id], 1);
      p.pair_row[i] = r;
      p.row_token[r] = i / p.top_k;
    } else {
      p.pair_row[i] = -1;
    }
  }
}

__global__ void __launch_bounds__(kThreads) MoeCombineKernel(MoeCombineParams p) {
  PdlBegin();
  const int64_t t = blockIdx.x;
  const int32_t* rows = p.pair_row != nullptr ? p.pair_row + t * p.top_k : nullptr;
  const float* w = p.topk_weights != nullptr ? p.topk_weights + t * p.top_k : nullptr;
  float* x = p.x + t * p.hidden;
  for (int j = threadIdx.x; j < p.hidden; j += blockDim.x) {
    float acc = 0.0f;
    for (int k = 0; k < p.top_k; ++k) {
      const int r = rows != nullptr ? rows[k] : static_cast<int>(t) * p.top_k + k;
      if (r >= 0)
        acc += (w != nullptr ? w[k] : 1.0f) * p.expert_out[static_cast<int64_t>(r) * p.hidden + j];
    }
    x[j] = p.overwrite ? acc : x[j] + acc;
  }
}

// The same with 16-byte accesses and the pairs' rows and weights read once:
// hidden % 4 == 0, 16-byte aligned expert_out and x, top_k <= kMaxCombineK.
constexpr int kMaxCombineK = 16;
__global__ void __launch_bounds__(kThreads) MoeCombineVec4Kernel(MoeCombineParams p) {
  PdlBegin();
  __shared__ int rows[kMaxCombineK];
  __shared__ float wts[kMaxCombineK];
  const int64_t t = blockIdx.x;
  if (threadIdx.x < p.top_k) {
    const int k = threadIdx.x;
    rows[k] =
        p.pair_row != nullptr ? p.pair_row[t * p.top_k + k] : static_cast<int>(t) * p.top_k + k;
    wts[k] = p.topk_weights != nullptr ? p.topk_weights[t * p.top_k + k] : 1.0f;
  }
  __syncthreads();
  float4* x = reinterpret_cast<float4*>(p.x + t * p.hidden);
  const int h4 = p.hidden / 4;
  // Grid (tokens, slices of the hidden width): at batch 1 one CTA took 12 us.
  for (int j = blockIdx.y * blockDim.x + threadIdx.x; j < h4; j += gridDim.y * blockDim.x) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k = 0; k < p.top_k; ++k) {  // in order, as the scalar kernel adds
      if (rows[k] < 0) continue;
      const float4 v = reinterpret_cast<const float4*>(p.expert_out +
                                                       static_cast<int64_t>(rows[k]) * p.hidden)[j];
      acc.x += wts[k] * v.x, acc.y += wts[k] * v.y, acc.z += wts[k] * v.z, acc.w += wts[k] * v.w;
    }
    if (p.overwrite) {
      x[j] = acc;
    } else {
      float4 o = x[j];
      o.x += acc.x, o.y += acc.y, o.z += acc.z, o.w += acc.w;
      x[j] = o;
    }
  }
}

// MLA attention, plain: one CTA per (head, query row); kMlaThreads tokens per
// chunk, one per thread for the scores, then threads over latent dims for P·V.
constexpr int kMlaThreads = 128;
constexpr int kMlaMaxDim = 1024;

__global__ void __launch_bounds__(kMlaThreads) MlaGenericKernel(MlaDecodeParams p) {
  PdlBegin();
  __shared__ float q[kMlaMaxDim];
  __shared__ float prob[kMlaThreads];
  __shared__ float red[32];
  const int h = blockIdx.x, b = blockIdx.y;
  const int rank = p.kv_lora_rank, dim = p.kv_lora_rank + p.rope_dim;
  const bf16* qrow = p.q + (static_cast<int64_t>(b) * p.num_heads + h) * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) q[d] = __bfloat162float(qrow[d]);
  __syncthreads();
  const int len = p.seq_lens[b];
  const int32_t* table = p.block_table + static_cast<int64_t>(b) * p.max_blocks_per_seq;
  const bool fp8 = p.kv_dtype == KvCacheDtype::kFp8;
  const int stride = p.kv_row_stride > 0 ? p.kv_row_stride
                     : fp8               ? cpu::Fp8KvRowLayout{rank, p.rope_dim}.bytes() / 2
                                         : dim;
  const int32_t* index =
      p.kv_index != nullptr ? p.kv_index + static_cast<int64_t>(b) * p.kv_index_stride : nullptr;
  auto row_of = [&](int i) {
    const int pos = index != nullptr ? index[i] : i;
    return p.kv_cache +
           (static_cast<int64_t>(table[pos / kKvBlockSize]) * kKvBlockSize + pos % kKvBlockSize) *
               stride;
  };
  auto value = [&](const bf16* row, int d) {
    return fp8 ? fp8kv::Load(reinterpret_cast<const uint8_t*>(row), rank, d)
               : __bfloat162float(row[d]);
  };
  constexpr int kMaxOwn = kMlaMaxDim / kMlaThreads;  // latent dims per thread
  float acc[kMaxOwn];
#pragma unroll
  for (int j = 0; j < kMaxOwn; ++j) acc[j] = 0.0f;
  float m = -INFINITY, l = 0.0f;  // running max and sum (identical in every thread)
  for (int base = 0; base < len; base += kMlaThreads) {
    const int t = base + threadIdx.x;
    float s = -INFINITY;
    if (t < len) {
      const bf16* row = row_of(t);
      float dot = 0.0f;
      for (int d = 0; d < dim; ++d) dot += q[d] * value(row, d);
      s = dot * p.softmax_scale;
    }
    // Chunk max.
    float cm = WarpMax(s);
    __syncthreads();  // red and prob of the previous chunk are consumed
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = cm;
    __syncthreads();
    cm = red[0];
    for (int w = 1; w < kMlaThreads / 32; ++w) cm = fmaxf(cm, red[w]);
    const float m_new = fmaxf(m, cm);
    const float scale_old = m == -INFINITY ? 0.0f : expf(m - m_new);
    const float pt = t < len ? expf(s - m_new) : 0.0f;
    prob[threadIdx.x] = pt;
    __syncthreads();
    float csum = 0.0f;
    const int n = min(kMlaThreads, len - base);
    for (int j = 0; j < n; ++j) csum += prob[j];
    l = l * scale_old + csum;
    m = m_new;
#pragma unroll
    for (int j = 0; j < kMaxOwn; ++j) {
      const int d = threadIdx.x + j * kMlaThreads;
      if (d < rank) {
        float a = acc[j] * scale_old;
        for (int i = 0; i < n; ++i) {
          a += prob[i] * value(row_of(base + i), d);
        }
        acc[j] = a;
      }
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  const int64_t out_row = (static_cast<int64_t>(b) * p.num_heads + h) * rank;
#pragma unroll
  for (int j = 0; j < kMaxOwn; ++j) {
    const int d = threadIdx.x + j * kMlaThreads;
    if (d < rank) {
      const float v = acc[j] * inv;
      if (p.out_type == OutType::kFloat32) {
        static_cast<float*>(p.out)[out_row + d] = v;
      } else {
        static_cast<bf16*>(p.out)[out_row + d] = __float2bfloat16_rn(v);
      }
    }
  }
  if (p.lse != nullptr && threadIdx.x == 0) {
    p.lse[static_cast<int64_t>(b) * p.num_heads + h] = len > 0 ? m + logf(l) : -INFINITY;
  }
}

}  // namespace

absl::Status RunEmbed(const EmbedParams& p) {
  if (p.num_tokens < 0 || p.hidden <= 0 || p.copies < 1)
    return absl::InvalidArgumentError("RunEmbed: bad shape");
  if (p.num_tokens == 0) return absl::OkStatus();
  if (!p.table || !p.token_ids || !p.out)
    return absl::InvalidArgumentError("RunEmbed: null pointer");
  return LaunchPdl("EmbedKernel", EmbedKernel, p.num_tokens, kThreads, 0, p.stream, p);
}

absl::Status RunRmsNormF32(const RmsNormF32Params& p) {
  RmsNormF32Params q = p;
  if (q.ldx == 0) q.ldx = q.n;
  if (q.num_rows < 0 || q.n <= 0 || q.ldx < q.n)
    return absl::InvalidArgumentError("RunRmsNormF32: bad shape");
  if (q.num_rows == 0) return absl::OkStatus();
  if (!q.x || !q.weight || !q.y) return absl::InvalidArgumentError("RunRmsNormF32: null pointer");
  const auto addr = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr); };
  if (q.n % 4 == 0 && q.ldx % 4 == 0 && addr(q.x) % 16 == 0 && addr(q.y) % 8 == 0 &&
      addr(q.weight) % 8 == 0 && addr(q.y_f32) % 16 == 0) {
    return LaunchPdl("RmsNormF32Vec4Kernel", RmsNormF32Vec4Kernel, q.num_rows, kThreads, 0,
                     q.stream, q);
  }
  return LaunchPdl("RmsNormF32Kernel", RmsNormF32Kernel, q.num_rows, kThreads, 0, q.stream, q);
}

absl::Status RunSliceCopy(const SliceCopyParams& p) {
  if (p.num_tokens < 0 || p.num_rows < 0 || p.dim < 0)
    return absl::InvalidArgumentError("RunSliceCopy: bad shape");
  if (p.num_tokens == 0 || p.num_rows == 0 || p.dim == 0) return absl::OkStatus();
  if (!p.src || !p.dst) return absl::InvalidArgumentError("RunSliceCopy: null pointer");
  const auto aligned = [](int64_t v) { return v % 8 == 0; };
  const bool vec = aligned(p.dim) && aligned(p.src_token_stride) && aligned(p.src_row_stride) &&
                   aligned(p.src_offset) && aligned(p.dst_token_stride) &&
                   aligned(p.dst_row_stride) && aligned(p.dst_offset) &&
                   reinterpret_cast<uintptr_t>(p.src) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(p.dst) % 16 == 0;
  const int64_t n = static_cast<int64_t>(p.num_tokens) * p.num_rows * (vec ? p.dim / 8 : p.dim);
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096));
  if (vec) {
    RETURN_IF_ERROR(
        LaunchPdl("SliceCopyKernel", SliceCopyKernel<8>, blocks, kThreads, 0, p.stream, p));
  } else {
    RETURN_IF_ERROR(
        LaunchPdl("SliceCopyKernel", SliceCopyKernel<1>, blocks, kThreads, 0, p.stream, p));
  }
  return absl::OkStatus();
}

absl::Status RunGatherRows(const GatherRowsParams& p) {
  const int ldx = p.ldx ? p.ldx : p.cols;
  const bool fp8 = p.fp8_latent > 0;
  if (p.rows < 0 || p.cols < 0 || p.cols % 8 != 0 || ldx % 8 != 0 || (!fp8 && ldx < p.cols)) {
    return absl::InvalidArgumentError(
        "RunGatherRows: need rows >= 0, cols and ldx multiples of 8, ldx >= cols");
  }
  if (fp8 && (p.fp8_latent % 16 != 0 || p.fp8_latent >= p.cols || p.ldx == 0 ||
              2 * p.ldx < cpu::Fp8KvRowLayout{p.fp8_latent, p.cols - p.fp8_latent}.bytes())) {
    return absl::InvalidArgumentError(
        "RunGatherRows: FP8 rows need a latent that is a multiple of 16 below cols and an "
        "explicit ldx covering the row's bytes");
  }
  if (p.rows == 0 || p.cols == 0) return absl::OkStatus();
  if (!p.x || !p.index || !p.out ||
      (reinterpret_cast<uintptr_t>(p.x) | reinterpret_cast<uintptr_t>(p.out)) % 16) {
    return absl::InvalidArgumentError("RunGatherRows: null or misaligned pointer");
  }
  GatherRowsParams q = p;
  q.ldx = ldx;
  return LaunchPdl("GatherRowsKernel", GatherRowsKernel,
                   (p.rows + kThreads / 32 - 1) / (kThreads / 32), kThreads, 0, p.stream, q);
}

absl::Status RunGatherKvRows(const GatherKvRowsParams& p) {
  const bool fp8 = p.dtype == KvCacheDtype::kFp8;
  const int width = p.latent + p.rope;
  const int row_units = fp8 ? cpu::Fp8KvRowLayout{p.latent, p.rope}.bytes() / 2 : width;
  GatherKvRowsParams q = p;
  q.row_stride = p.row_stride ? p.row_stride : row_units;
  q.ldo = p.ldo ? p.ldo : width;
  if (p.latent <= 0 || p.rope < 0 || width % 8 != 0 || q.row_stride % 8 != 0 || q.ldo % 8 != 0 ||
      q.ldo < width || q.row_stride < row_units || (fp8 && p.latent % 16 != 0) || p.from < 0 ||
      p.count < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RunGatherKvRows: latent ", p.latent, ", rope ", p.rope, ", row stride ", q.row_stride,
        ", ldo ", q.ldo, ", from ", p.from, ", count ", p.count,
        ": need latent + rope, the row stride and ldo multiples of 8, ldo >= latent + rope, the "
        "row stride >= the row's, FP8 latent a multiple of 16, from and count >= 0"));
  }
  if (p.count == 0) return absl::OkStatus();
  if (!p.cache || !p.block_table || !p.out ||
      (reinterpret_cast<uintptr_t>(p.cache) | reinterpret_cast<uintptr_t>(p.out)) % 16) {
    return absl::InvalidArgumentError("RunGatherKvRows: null or misaligned pointer");
  }
  constexpr int kRowsPerCta = kThreads / 32;
  return LaunchPdl("GatherKvRowsKernel", GatherKvRowsKernel,
                   (p.count + kRowsPerCta - 1) / kRowsPerCta, kThreads, 0, p.stream, q);
}

absl::Status RunCopyKvBlocks(const CopyKvBlocksParams& p) {
  if (p.num_blocks < 0 || p.num_layers < 1 || p.block_elems <= 0 || p.block_elems % 8 != 0 ||
      p.src_layer_elems % 8 != 0 || p.dst_layer_elems % 8 != 0 || p.num_layers > 65535) {
    return absl::InvalidArgumentError(
        "RunCopyKvBlocks: need block_elems and layer strides multiples of 8");
  }
  if (p.num_blocks == 0) return absl::OkStatus();
  if (!p.src || !p.dst || !p.src_blocks || !p.dst_blocks ||
      (reinterpret_cast<uintptr_t>(p.src) | reinterpret_cast<uintptr_t>(p.dst)) % 16) {
    return absl::InvalidArgumentError("RunCopyKvBlocks: null or misaligned pointer");
  }
  return LaunchPdl("CopyKvBlocksKernel", CopyKvBlocksKernel, dim3(p.num_blocks, p.num_layers),
                   kThreads, 0, p.stream, p);
}

absl::Status RunMoePermute(const MoePermuteParams& p) {
  if (p.num_tokens < 0 || p.top_k < 1 || p.num_experts < 1 || p.num_experts > kPermuteThreads ||
      (p.tile_m != 16 && p.tile_m != 32 && p.tile_m != 64)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunMoePermute: need top_k >= 1, 1 <= num_experts <= ", kPermuteThreads,
                     ", tile_m 16, 32 or 64"));
  }
  if (!p.topk_ids || !p.expert_offsets || !p.tile_offsets || !p.row_token || !p.pair_row) {
    return absl::InvalidArgumentError("RunMoePermute: null pointer");
  }
  if (p.expert_map != nullptr && p.map_size < 1)
    return absl::InvalidArgumentError("RunMoePermute: empty expert_map");
  return LaunchPdl("MoePermuteKernel", MoePermuteKernel, 1, kPermuteThreads, 0, p.stream, p);
}

absl::Status RunMoeCombine(const MoeCombineParams& p) {
  if (p.num_tokens < 0 || p.top_k < 1 || p.hidden <= 0)
    return absl::InvalidArgumentError("RunMoeCombine: bad shape");
  if (p.num_tokens == 0) return absl::OkStatus();
  if (!p.expert_out || !p.x) {
    return absl::InvalidArgumentError("RunMoeCombine: null pointer");
  }
  if (p.hidden % 4 == 0 && p.top_k <= kMaxCombineK &&
      reinterpret_cast<uintptr_t>(p.expert_out) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(p.x) % 16 == 0) {
    const dim3 grid(p.num_tokens, std::min((p.hidden / 4 + kThreads - 1) / kThreads, 8));
    return LaunchPdl("MoeCombineVec4Kernel", MoeCombineVec4Kernel, grid, kThreads, 0, p.stream, p);
  }
  return LaunchPdl("MoeCombineKernel", MoeCombineKernel, p.num_tokens, kThreads, 0, p.stream, p);
}

absl::Status RunMlaAttentionGeneric(const MlaDecodeParams& p) {
  if (p.batch < 0 || p.num_heads <= 0 || p.kv_lora_rank <= 0 || p.rope_dim < 0 ||
      p.kv_lora_rank + p.rope_dim > kMlaMaxDim || p.max_blocks_per_seq <= 0 || p.batch > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunMlaAttentionGeneric: need kv_lora_rank + rope_dim <= ", kMlaMaxDim,
                     ", batch <= 65535"));
  }
  if (p.batch == 0) return absl::OkStatus();
  if (!p.q || !p.kv_cache || !p.block_table || !p.seq_lens || !p.out) {
    return absl::InvalidArgumentError("RunMlaAttentionGeneric: null pointer");
  }
  const bool fp8 = p.kv_dtype == KvCacheDtype::kFp8;
  // FP8 rows hold float32 scales: rows of whole 16 bytes from a 16-byte aligned cache.
  if (fp8 && (p.kv_lora_rank % 16 != 0 || p.rope_dim % 2 != 0 || p.kv_row_stride % 8 != 0 ||
              (reinterpret_cast<uintptr_t>(p.kv_cache) & 15))) {
    return absl::InvalidArgumentError(
        "RunMlaAttentionGeneric: FP8 rows need kv_lora_rank a multiple of 16, an even rope_dim, "
        "a row stride of whole 16 bytes and a 16-byte aligned cache");
  }
  const int row_units = fp8 ? cpu::Fp8KvRowLayout{p.kv_lora_rank, p.rope_dim}.bytes() / 2
                            : p.kv_lora_rank + p.rope_dim;
  if ((p.kv_row_stride != 0 && p.kv_row_stride < row_units) ||
      (p.kv_index != nullptr && p.kv_index_stride < 1)) {
    return absl::InvalidArgumentError(
        "RunMlaAttentionGeneric: row stride below the row, or an index without a stride");
  }
  const dim3 grid(p.num_heads, p.batch);
  return LaunchPdl("MlaGenericKernel", MlaGenericKernel, grid, kMlaThreads, 0, p.stream, p);
}

}  // namespace moesh::cuda
