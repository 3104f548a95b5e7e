// MoE gate: one warp per token. Lane l holds experts l, l + 32, l + 64, ...;
// every top-k is a sequence of warp-wide argmax rounds whose comparator sends
// ties to the lower index, as kernels/cpu/moe_gate.cc's TopK does.
#include <cfloat>
#include <climits>

#include "kernels/cuda/config.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/routing.h"

namespace moesh::cuda {
namespace {

using gate::kWarpsPerBlock;
constexpr unsigned kFull = 0xffffffffu;

template <int kPerLane>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) MoeGateKernel(MoeGateParams p) {
  PdlBegin();
  __shared__ float choice_smem[kWarpsPerBlock][gate::kMaxExperts];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int t = blockIdx.x * kWarpsPerBlock + warp;
  if (t >= p.num_tokens) return;  // warp-uniform
  const int e_total = p.num_experts;
  const float* logits = p.logits + static_cast<int64_t>(t) * e_total;

  float score[kPerLane], choice[kPerLane];
  unsigned taken = 0;  // bit j: expert lane + 32 j is out of the running
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    score[j] = e < e_total ? logits[e] : -INFINITY;
    if (e >= e_total) taken |= 1u << j;
  }
  if (p.scoring == GateScoring::kSoftmax) {
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) mx = fmaxf(mx, score[j]);
    mx = WarpMax(mx);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      score[j] = (taken >> j & 1) ? 0.0f : expf(score[j] - mx);
      sum += score[j];
    }
    sum = WarpSum(sum);
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) score[j] /= sum;
  } else if (p.scoring == GateScoring::kSigmoid) {
#pragma unroll
    for (int j = 0; j < kPerLane; ++j)
      score[j] = (taken >> j & 1) ? 0.0f : 1.0f / (1.0f + expf(-score[j]));
  } else {  // sqrt(softplus), torch's softplus linear above 20
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const float x = score[j];
      score[j] = (taken >> j & 1) ? 0.0f : sqrtf(x > 20.0f ? x : log1pf(expf(x)));
    }
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int e = lane + 32 * j;
    choice[j] = score[j] + ((p.bias != nullptr && e < e_total) ? p.bias[e] : 0.0f);
  }

  if (p.select != GateSelect::kGreedy && p.forced_table == nullptr) {
    float* smem = choice_smem[warp];
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      if (lane + 32 * j < e_total) smem[lane + 32 * j] = choice[j];
    }
    __syncwarp();
    const int per_group = e_total / p.n_group;
    float gscore = -INFINITY;
    if (lane < p.n_group) {
      const float* s = smem + lane * per_group;
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int i = 0; i < per_group; ++i) {
        const float v = s[i];
        if (v > b1) {
          b2 = b1;
          b1 = v;
        } else if (v > b2) {
          b2 = v;
        }
      }
      gscore = p.select == GateSelect::kGroupMax ? b1 : b1 + b2;
    }
    // Keep topk_group groups.
    bool group_taken = lane >= p.n_group;
    unsigned keep = 0;
    for (int r = 0; r < p.topk_group; ++r) {
      float v = group_taken ? -INFINITY : gscore;
      int i = group_taken ? INT_MAX : lane;
      WarpArgBest(v, i);
      keep |= 1u << i;
      if (lane == i) group_taken = true;
    }
    const float masked = p.select == GateSelect::kGroupMax ? 0.0f : -INFINITY;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int e = lane + 32 * j;
      if (e < e_total && !(keep >> (e / per_group) & 1)) choice[j] = masked;
    }
  }

  // Final top-k; lane k keeps pick k.
  int my_id = 0;
  float my_w = 0.0f;
  const int32_t* forced = p.forced_table != nullptr
                              ? p.forced_table + static_cast<int64_t>(p.token_ids[t]) * p.top_k
                              : nullptr;
  for (int k = 0; k < p.top_k; ++k) {
    float v = -INFINITY;
    int i = INT_MAX;
    if (forced != nullptr) {
      i = forced[k];
    } else {
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        if (!(taken >> j & 1) && Better(choice[j], lane + 32 * j, v, i)) {
          v = choice[j];
          i = lane + 32 * j;
        }
      }
      WarpArgBest(v, i);
    }
    const int owner = i & 31, jj = i >> 5;
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      if (j == jj) s = score[j];
    }
    s = __shfl_sync(kFull, s, owner);
    if (lane == owner) taken |= 1u << jj;
    if (lane == k) {
      my_id = i;
      my_w = s;
    }
  }
  // The sum in pick order, as the CPU reference adds it.
  float sum = 0.0f;
  for (int k = 0; k < p.top_k; ++k) sum += __shfl_sync(kFull, my_w, k);
  const float norm = p.renormalize ? 1.0f / (sum + 1e-20f) : 1.0f;
  if (lane < p.top_k) {
    p.topk_ids[static_cast<int64_t>(t) * p.top_k + lane] = my_id;
    p.topk_weights[static_cast<int64_t>(t) * p.top_k + lane] =
        my_w * norm * p.routed_scaling_factor;
  }
}

}  // namespace

absl::Status RunMoeGate(const MoeGateParams& p) {
  if (p.num_tokens < 0 || p.top_k < 1 || p.top_k > gate::kMaxTopK || p.num_experts < p.top_k ||
      p.num_experts > gate::kMaxExperts) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunMoeGate: need 1 <= top_k <= ", gate::kMaxTopK,
                     " and top_k <= num_experts <= ", gate::kMaxExperts));
  }
  if (p.select != GateSelect::kGreedy &&
      (p.n_group < 1 || p.n_group > gate::kMaxGroups || p.num_experts % p.n_group != 0 ||
       p.topk_group < 1 || p.topk_group > p.n_group)) {
    return absl::InvalidArgumentError(
        absl::StrCat("RunMoeGate: grouped selection needs n_group in [1, ", gate::kMaxGroups,
                     "] dividing num_experts, and 1 <= topk_group <= n_group"));
  }
  if ((p.forced_table == nullptr) != (p.token_ids == nullptr)) {
    return absl::InvalidArgumentError("RunMoeGate: forced_table and token_ids go together");
  }
  if (p.num_tokens == 0) return absl::OkStatus();
  if (!p.logits || !p.topk_ids || !p.topk_weights)
    return absl::InvalidArgumentError("RunMoeGate: null pointer");
  const int blocks = (p.num_tokens + kWarpsPerBlock - 1) / kWarpsPerBlock;
  const int per_lane = (p.num_experts + 31) / 32;
  absl::Status st;
  DispatchUpTo<2, 4, 8, 16>(per_lane, [&](auto k) {
    st.Update(LaunchPdl("MoeGateKernel", MoeGateKernel<decltype(k)::value>, blocks,
                        kWarpsPerBlock * 32, 0, p.stream, p));
  });
  return st;
}

}  // namespace moesh::cuda
