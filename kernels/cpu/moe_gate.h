// MoE routing on the CPU: scores from router logits, (grouped) top-k
// selection, renormalisation and scaling, as the DeepSeek families define it.
#ifndef MOESH_KERNELS_CPU_MOE_GATE_H_
#define MOESH_KERNELS_CPU_MOE_GATE_H_

#include <cstdint>

namespace moesh::cpu {

// kSqrtSoftplus: sqrt(softplus(x)) (DeepSeek-V4).
enum class GateScoring { kSoftmax, kSigmoid, kSqrtSoftplus };

enum class GateSelect {
  kGreedy,        // top-k over all experts (V2-Lite "greedy")
  kGroupMax,      // keep topk_group groups by their best score (V2 "group_limited_greedy")
  kGroupTop2Sum,  // keep groups by the sum of their top-2 biased scores (V3 "noaux_tc")
};

struct MoeGateParams {
  const float* logits = nullptr;  // [num_tokens, num_experts] router logits
  const float* bias = nullptr;    // [num_experts] selection-only bias; may be null
  int num_tokens = 0;
  int num_experts = 0;
  int top_k = 0;
  int n_group = 1;
  int topk_group = 1;
  GateScoring scoring = GateScoring::kSoftmax;
  GateSelect select = GateSelect::kGreedy;
  bool renormalize = false;  // divide the k weights by their sum (+1e-20)
  float routed_scaling_factor = 1.0f;
  // May be null. Hash routing (DeepSeek-V4's first layers): token t uses
  // experts forced_ids[t, :] and no selection runs; weights are still the
  // scores of those experts (renormalised and scaled as above).
  const int32_t* forced_ids = nullptr;  // [num_tokens, top_k]
  int32_t* topk_ids = nullptr;          // [num_tokens, top_k], best first
  float* topk_weights = nullptr;        // [num_tokens, top_k]
};

void RunMoeGate(const MoeGateParams& p);

}  // namespace moesh::cpu

#endif  // MOESH_KERNELS_CPU_MOE_GATE_H_
