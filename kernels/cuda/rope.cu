// RoPE in place, and RoPE fused with the write of the latent KV row into the
// paged cache (the arithmetic: rope.cuh).
#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/fp8_kv.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/rope.cuh"

namespace moesh::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHalf = 256;  // rope dims up to 512
constexpr int kMaxFp8Latent = 1024;

struct Rotation {
  const float* inv_freq;
  float attention_factor;
  int half;
  bool interleaved;
};

Rotation MakeRotation(const RopeTableView& t) {
  return {t.inv_freq, t.attention_factor, t.dim / 2, t.layout == RopeLayout::kInterleaved};
}

// cs[i] = (cos, sin) of pair i at `position`. Ends with a barrier.
__device__ void FillCosSin(const Rotation& r, int position, float2* cs) {
  for (int i = threadIdx.x; i < r.half; i += blockDim.x)
    cs[i] = RopeCosSin(r.inv_freq, r.attention_factor, i, position);
  __syncthreads();
}

// Rotates pair i of the slice at `src`, writing it to `dst` (may equal src).
__device__ __forceinline__ void RotatePair(const Rotation& r, const float2* cs, int i,
                                           const bf16* src, bf16* dst) {
  const int a = r.interleaved ? 2 * i : i;
  const int b = r.interleaved ? 2 * i + 1 : i + r.half;
  const float2 v =
      RopeRotate(make_float2(__bfloat162float(src[a]), __bfloat162float(src[b])), cs[i]);
  dst[a] = __float2bfloat16_rn(v.x);
  dst[b] = __float2bfloat16_rn(v.y);
}

// Ropes rows [num_rows] of one token's slices from src into dst (may be
// equal: in place).
__device__ void RopeRows(const Rotation& r, const float2* cs, const bf16* src, int src_stride,
                         bf16* dst, int dst_stride, int num_rows) {
  for (int j = threadIdx.x; j < num_rows * r.half; j += blockDim.x) {
    const int64_t row = j / r.half;
    RotatePair(r, cs, j % r.half, src + row * src_stride, dst + row * dst_stride);
  }
}

__global__ void __launch_bounds__(kThreads) RopeKernel(RopeParams p, Rotation r) {
  PdlBegin();
  __shared__ float2 cs[kMaxHalf];
  const int t = blockIdx.x;
  FillCosSin(r, p.positions[t], cs);
  bf16* x = p.x + static_cast<int64_t>(t) * p.token_stride + p.offset;
  RopeRows(r, cs, x, p.row_stride, x, p.row_stride, p.num_rows);
}

// The FP8 row (cpu::PackFp8KvRow) of latent[rank] (float32, in shared
// memory) but the rope part, which the caller writes. Each group's amax (as
// bits, in shared memory) is replaced by its scale, once a group. All threads.
__device__ void StoreFp8Latent(const float* latent, int rank, unsigned* amax_bits, uint8_t* dst) {
  const cpu::Fp8KvRowLayout layout{rank, 0};
  float* scales = reinterpret_cast<float*>(amax_bits);
  for (int g = threadIdx.x; g < cpu::Fp8Blocks(rank); g += blockDim.x) {
    const float scale = fp8kv::Scale(__uint_as_float(amax_bits[g]));
    scales[g] = scale;
    reinterpret_cast<float*>(dst + layout.scales_offset())[g] = scale;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rank; i += blockDim.x)
    dst[i] = fp8kv::Code(latent[i], scales[i / cpu::kFp8Block]);
}

template <KvCacheDtype kDtype>
__global__ void __launch_bounds__(kThreads) RopeKvCacheKernel(RopeKvCacheParams p, Rotation r) {
  PdlBegin();
  constexpr bool kFp8 = kDtype == KvCacheDtype::kFp8;
  __shared__ float2 cs[kMaxHalf];
  __shared__ float scratch[32];
  // FP8: the normalized latent in float32, and each group's max |x| as bits
  // (non-negative floats order as their bits).
  __shared__ float latent[kFp8 ? kMaxFp8Latent : 1];
  __shared__ unsigned amax_bits[kFp8 ? kMaxFp8Latent / cpu::kFp8Block : 1];
  const int t = blockIdx.x;
  FillCosSin(r, p.positions[t], cs);
  if (p.q != nullptr) {
    bf16* q = p.q + static_cast<int64_t>(t) * p.q_token_stride + p.q_rope_offset;
    const bool copy = p.q_src != nullptr;
    const bf16* src =
        copy ? p.q_src + static_cast<int64_t>(t) * p.q_src_token_stride + p.q_src_offset : q;
    RopeRows(r, cs, src, copy ? p.q_src_head_stride : p.q_head_stride, q, p.q_head_stride,
             p.q_num_heads);
  }
  const int slot = p.slot_mapping[t];
  if (slot < 0 || slot >= p.num_blocks * kKvBlockSize) return;  // uniform across the CTA
  const int rank = p.kv_lora_rank;
  const bf16* src = p.kv + static_cast<int64_t>(t) * p.kv_ld;
  if constexpr (kFp8) {
    const cpu::Fp8KvRowLayout layout{rank, 2 * r.half};
    uint8_t* dst = reinterpret_cast<uint8_t*>(p.cache) +
                   static_cast<int64_t>(slot) *
                       (p.cache_row_stride > 0 ? 2 * p.cache_row_stride : layout.bytes());
    for (int g = threadIdx.x; g < cpu::Fp8Blocks(rank); g += blockDim.x) amax_bits[g] = 0u;
    float inv = 1.0f;
    if (p.kv_norm_weight != nullptr) {
      float ss = 0.0f;
      for (int i = threadIdx.x; i < rank; i += blockDim.x) {
        const float v = __bfloat162float(src[i]);
        ss += v * v;
      }
      inv = rsqrtf(BlockSum(ss, scratch) / static_cast<float>(rank) + p.eps);  // ends synced
    } else {
      __syncthreads();  // amax_bits zeroed
    }
    for (int i = threadIdx.x; i < rank; i += blockDim.x) {
      const float v = p.kv_norm_weight != nullptr
                          ? __bfloat162float(p.kv_norm_weight[i]) * (__bfloat162float(src[i]) * inv)
                          : __bfloat162float(src[i]);
      latent[i] = v;
      const float a = fabsf(v);
      if (!isnan(a)) atomicMax(&amax_bits[i / cpu::kFp8Block], __float_as_uint(a));
    }
    __syncthreads();
    StoreFp8Latent(latent, rank, amax_bits, dst);
    bf16* rope_dst = reinterpret_cast<bf16*>(dst + layout.rope_offset());
    for (int i = threadIdx.x; i < r.half; i += blockDim.x)
      RotatePair(r, cs, i, src + rank, rope_dst);
    // The padding, where the row ends with the rope part (a wider row's
    // bytes after it are another writer's: V3.2's index key).
    if (p.cache_row_stride == 0 || 2 * p.cache_row_stride == layout.bytes()) {
      for (int i = layout.rope_offset() + 2 * layout.rope + threadIdx.x; i < layout.bytes();
           i += blockDim.x) {
        dst[i] = 0;
      }
    }
    return;
  }
  bf16* dst = p.cache + static_cast<int64_t>(slot) *
                            (p.cache_row_stride > 0 ? p.cache_row_stride : rank + 2 * r.half);
  if (p.kv_norm_weight != nullptr) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < rank; i += blockDim.x) {
      const float v = __bfloat162float(src[i]);
      ss += v * v;
    }
    const float inv = rsqrtf(BlockSum(ss, scratch) / static_cast<float>(rank) + p.eps);
    for (int i = threadIdx.x; i < rank; i += blockDim.x) {
      dst[i] = __float2bfloat16_rn(__bfloat162float(p.kv_norm_weight[i]) *
                                   (__bfloat162float(src[i]) * inv));
    }
  } else {
    for (int i = threadIdx.x; i < rank; i += blockDim.x) dst[i] = src[i];
  }
  for (int i = threadIdx.x; i < r.half; i += blockDim.x)
    RotatePair(r, cs, i, src + rank, dst + rank);
}

absl::Status CheckTable(const RopeTableView& t, const char* op) {
  if (t.dim <= 0 || t.dim % 2 != 0 || t.dim / 2 > kMaxHalf || t.inv_freq == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": rope dim must be even, in (0, ",
                                                   2 * kMaxHalf, "], with an inv_freq table"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunRope(const RopeParams& p) {
  RETURN_IF_ERROR(CheckTable(p.rope, "RunRope"));
  if (p.num_tokens < 0 || p.num_rows < 0 || p.offset < 0 || p.offset + p.rope.dim > p.row_stride ||
      (p.num_rows > 1 && p.token_stride < p.num_rows * p.row_stride && p.num_tokens > 1)) {
    return absl::InvalidArgumentError("RunRope: slice outside its row, or rows overlapping");
  }
  if (p.num_tokens == 0 || p.num_rows == 0) return absl::OkStatus();
  if (!p.x || !p.positions) return absl::InvalidArgumentError("RunRope: null pointer");
  return LaunchPdl("RopeKernel", RopeKernel, p.num_tokens, kThreads, 0, p.stream, p,
                   MakeRotation(p.rope));
}

absl::Status RunRopeKvCacheWrite(const RopeKvCacheParams& p) {
  RETURN_IF_ERROR(CheckTable(p.rope, "RunRopeKvCacheWrite"));
  // The row's 2-byte units (FP8: the layout's bytes / 2, checked below).
  const bool fp8 = p.cache_dtype == KvCacheDtype::kFp8;
  if (p.num_tokens < 0 || p.kv_lora_rank <= 0 || p.kv_ld < p.kv_lora_rank + p.rope.dim ||
      p.num_blocks < 0 ||
      (!fp8 && p.cache_row_stride != 0 && p.cache_row_stride < p.kv_lora_rank + p.rope.dim)) {
    return absl::InvalidArgumentError(
        "RunRopeKvCacheWrite: need kv_lora_rank > 0, kv_ld >= rank + rope dim, and a bf16 row "
        "stride of at least rank + rope dim");
  }
  if (p.q != nullptr && (p.q_num_heads <= 0 || p.q_rope_offset < 0 ||
                         p.q_rope_offset + p.rope.dim > p.q_head_stride ||
                         p.q_token_stride < p.q_num_heads * p.q_head_stride)) {
    return absl::InvalidArgumentError("RunRopeKvCacheWrite: q rope slice outside its head row");
  }
  if (p.q != nullptr && p.q_src != nullptr &&
      (p.q_src_offset < 0 || p.q_src_offset + p.rope.dim > p.q_src_head_stride ||
       p.q_src_token_stride < p.q_num_heads * p.q_src_head_stride)) {
    return absl::InvalidArgumentError("RunRopeKvCacheWrite: q_src rope slice outside its head row");
  }
  if (fp8) {
    const cpu::Fp8KvRowLayout layout{p.kv_lora_rank, p.rope.dim};
    // The rows hold float32 scales: whole 16 bytes each, from a 16-byte aligned cache.
    if (p.kv_lora_rank % 16 != 0 || p.kv_lora_rank > kMaxFp8Latent ||
        (p.cache_row_stride != 0 && 2 * p.cache_row_stride < layout.bytes()) ||
        p.cache_row_stride % 8 != 0 || (reinterpret_cast<uintptr_t>(p.cache) & 15)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RunRopeKvCacheWrite: an FP8 cache needs kv_lora_rank a multiple of 16 up to ",
          kMaxFp8Latent, ", rows of at least ", layout.bytes(),
          " bytes in whole 16 bytes and a 16-byte aligned cache"));
    }
  }
  if (p.num_tokens == 0) return absl::OkStatus();
  if (!p.kv || !p.cache || !p.slot_mapping || !p.positions) {
    return absl::InvalidArgumentError("RunRopeKvCacheWrite: null pointer");
  }
  if (fp8) {
    RETURN_IF_ERROR(LaunchPdl("RopeKvCacheKernel", RopeKvCacheKernel<KvCacheDtype::kFp8>,
                              p.num_tokens, kThreads, 0, p.stream, p, MakeRotation(p.rope)));
  } else {
    RETURN_IF_ERROR(LaunchPdl("RopeKvCacheKernel", RopeKvCacheKernel<KvCacheDtype::kBf16>,
                              p.num_tokens, kThreads, 0, p.stream, p, MakeRotation(p.rope)));
  }
  return absl::OkStatus();
}

}  // namespace moesh::cuda
