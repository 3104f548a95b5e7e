// Greedy argmax + top-k log-probabilities: one CTA per row of logits. Each
// thread keeps a running (max, sum-exp) and a sorted top-K of its strided
// share; the CTA merges them (log-sum-exp by reduction, top-k by K rounds of
// a block-wide argmax).
#include <algorithm>
#include <climits>

#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/routing.h"

namespace moesh::cuda {
namespace {

using sampling::kThreads;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

// (m, s): s = sum exp(x - m) over the values seen.
__device__ __forceinline__ void LseMerge(float& m, float& s, float om, float os) {
  if (om == -INFINITY) return;
  if (m == -INFINITY) {
    m = om;
    s = os;
    return;
  }
  const float nm = fmaxf(m, om);
  s = s * expf(m - nm) + os * expf(om - nm);
  m = nm;
}

template <int kK>
struct TopList {
  float v[kK];
  int i[kK];
  __device__ void Init() {
#pragma unroll
    for (int j = 0; j < kK; ++j) {
      v[j] = -INFINITY;
      i[j] = INT_MAX;
    }
  }
  // REQUIRES: idx greater than every index offered before (ties keep order).
  __device__ __forceinline__ void Offer(float x, int idx) {
    if (!(x > v[kK - 1])) return;
    v[kK - 1] = x;
    i[kK - 1] = idx;
#pragma unroll
    for (int j = kK - 1; j > 0; --j) {
      if (v[j] > v[j - 1]) {
        const float tv = v[j];
        v[j] = v[j - 1];
        v[j - 1] = tv;
        const int ti = i[j];
        i[j] = i[j - 1];
        i[j - 1] = ti;
      }
    }
  }
  __device__ __forceinline__ void Pop() {
#pragma unroll
    for (int j = 0; j + 1 < kK; ++j) {
      v[j] = v[j + 1];
      i[j] = i[j + 1];
    }
    v[kK - 1] = -INFINITY;
    i[kK - 1] = INT_MAX;
  }
};

template <int kK, bool kVec4>
__global__ void __launch_bounds__(kThreads) GreedyLogprobsKernel(GreedyLogprobsParams p) {
  PdlBegin();
  __shared__ float red_v[kWarps];
  __shared__ int red_i[kWarps];
  __shared__ float red_s[kWarps];
  __shared__ float lse_smem;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* row = p.logits + static_cast<int64_t>(blockIdx.x) * p.ld;
  TopList<kK> top;
  top.Init();
  float m = -INFINITY, s = 0.0f;
  auto take = [&](float x, int idx) {
    if (x > m) {
      s = (m == -INFINITY ? 0.0f : s * expf(m - x)) + 1.0f;
      m = x;
    } else {
      s += expf(x - m);
    }
    top.Offer(x, idx);
  };
  if constexpr (kVec4) {
    // kLoads independent 16-byte loads in flight per thread, then their logits in order.
    constexpr int kLoads = 4;
    for (int base = threadIdx.x * 4; base < p.vocab; base += kThreads * 4 * kLoads) {
      float4 v[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int at = base + u * kThreads * 4;
        v[u] = at + 4 <= p.vocab ? *reinterpret_cast<const float4*>(row + at)
                                 : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        const int at = base + u * kThreads * 4;
        if (at + 4 <= p.vocab) {
          take(v[u].x, at);
          take(v[u].y, at + 1);
          take(v[u].z, at + 2);
          take(v[u].w, at + 3);
        } else {
          for (int idx = at; idx < p.vocab; ++idx) take(row[idx], idx);
        }
      }
    }
  } else {
    for (int idx = threadIdx.x; idx < p.vocab; idx += kThreads) take(row[idx], idx);
  }

  // Log-sum-exp of the row.
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(kFull, m, o), os = __shfl_xor_sync(kFull, s, o);
    LseMerge(m, s, om, os);
  }
  if (lane == 0) {
    red_v[warp] = m;
    red_s[warp] = s;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < kWarps ? red_v[lane] : -INFINITY;
    s = lane < kWarps ? red_s[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float om = __shfl_xor_sync(kFull, m, o), os = __shfl_xor_sync(kFull, s, o);
      LseMerge(m, s, om, os);
    }
    if (lane == 0) lse_smem = m + logf(s);
  }
  __syncthreads();
  const float lse = lse_smem;

  // Top-k: round r takes the best head among all threads' lists.
  const int rounds = p.top_k > 0 ? p.top_k : 1;
  for (int r = 0; r < rounds; ++r) {
    float v = top.v[0];
    int i = top.i[0];
    WarpArgBest(v, i);
    __syncthreads();  // the previous round's reads of red_* are done
    if (lane == 0) {
      red_v[warp] = v;
      red_i[warp] = i;
    }
    __syncthreads();
    v = red_v[0];
    i = red_i[0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
      if (Better(red_v[w], red_i[w], v, i)) {
        v = red_v[w];
        i = red_i[w];
      }
    }
    if (top.i[0] == i) top.Pop();
    if (threadIdx.x == 0) {
      const int64_t b = blockIdx.x;
      if (r == 0) {
        p.next_ids[b] = i;
        if (p.next_logprobs != nullptr) p.next_logprobs[b] = v - lse;
      }
      if (p.top_k > 0) {
        p.topk_ids[b * p.top_k + r] = i;
        p.topk_logprobs[b * p.top_k + r] = v - lse;
      }
    }
  }
}

}  // namespace

absl::Status RunGreedyLogprobs(const GreedyLogprobsParams& p) {
  const int ld = p.ld ? p.ld : p.vocab;
  if (p.batch < 0 || p.top_k < 0 || p.top_k > sampling::kMaxTopK ||
      p.vocab < std::max(p.top_k, 1) || ld < p.vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunGreedyLogprobs: need 0 <= top_k <= ", sampling::kMaxTopK,
                     ", vocab >= max(top_k, 1), ld >= vocab"));
  }
  if (p.batch == 0) return absl::OkStatus();
  if (!p.logits || !p.next_ids || (p.top_k > 0 && (!p.topk_ids || !p.topk_logprobs))) {
    return absl::InvalidArgumentError("RunGreedyLogprobs: null pointer");
  }
  GreedyLogprobsParams q = p;
  q.ld = ld;
  const bool vec4 = ld % 4 == 0 && (reinterpret_cast<uintptr_t>(p.logits) & 15) == 0;
  absl::Status st;
  DispatchUpTo<1, 8, 20>(std::max(p.top_k, 1), [&](auto k) {
    constexpr int kK = decltype(k)::value;
    st.Update(vec4 ? LaunchPdl("GreedyLogprobsKernel", GreedyLogprobsKernel<kK, true>, p.batch,
                               kThreads, 0, p.stream, q)
                   : LaunchPdl("GreedyLogprobsKernel", GreedyLogprobsKernel<kK, false>, p.batch,
                               kThreads, 0, p.stream, q));
  });
  return st;
}

}  // namespace moesh::cuda
