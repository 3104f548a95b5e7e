#include "kernels/cpu/moe_gate.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace moesh::cpu {
namespace {

// Indices of the k largest values, best first; ties go to the lower index.
void TopK(const float* v, int n, int k, int* out) {
  std::vector<int> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [v](int a, int b) { return v[a] > v[b] || (v[a] == v[b] && a < b); });
  std::copy(idx.begin(), idx.begin() + k, out);
}

// The experts token `scores` picks, by p.select (see GateSelect).
void Select(const MoeGateParams& p, const std::vector<float>& scores, std::vector<float>* choice_v,
            std::vector<float>* group_score_v, std::vector<int>* groups_v, std::vector<int>* top2_v,
            std::vector<int>* picked) {
  const int e = p.num_experts;
  const int per_group = e / p.n_group;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float>& choice = *choice_v;
  std::vector<float>& group_score = *group_score_v;
  std::vector<int>& groups = *groups_v;
  std::vector<int>& top2 = *top2_v;
  for (int i = 0; i < e; ++i) choice[i] = scores[i] + (p.bias ? p.bias[i] : 0.0f);

  if (p.select != GateSelect::kGreedy) {
    for (int g = 0; g < p.n_group; ++g) {
      const float* s = choice.data() + g * per_group;
      if (p.select == GateSelect::kGroupMax) {
        group_score[g] = *std::max_element(s, s + per_group);
      } else {
        TopK(s, per_group, 2, top2.data());
        group_score[g] = s[top2[0]] + s[top2[1]];
      }
    }
    TopK(group_score.data(), p.n_group, p.topk_group, groups.data());
    std::vector<bool> keep(p.n_group, false);
    for (int g : groups) keep[g] = true;
    // V2 masks dropped groups to 0 (scores are positive), V3 to -inf.
    const float masked = p.select == GateSelect::kGroupMax ? 0.0f : kNegInf;
    for (int g = 0; g < p.n_group; ++g) {
      if (keep[g]) continue;
      std::fill(choice.begin() + g * per_group, choice.begin() + (g + 1) * per_group, masked);
    }
  }
  TopK(choice.data(), e, p.top_k, picked->data());
}

}  // namespace

void RunMoeGate(const MoeGateParams& p) {
  const int e = p.num_experts;
  std::vector<float> scores(e), choice(e), group_score(p.n_group);
  std::vector<int> picked(p.top_k), groups(p.topk_group), top2(2);
  for (int t = 0; t < p.num_tokens; ++t) {
    const float* logits = p.logits + static_cast<int64_t>(t) * e;
    if (p.scoring == GateScoring::kSoftmax) {
      const float mx = *std::max_element(logits, logits + e);
      float sum = 0.0f;
      for (int i = 0; i < e; ++i) sum += (scores[i] = std::exp(logits[i] - mx));
      for (int i = 0; i < e; ++i) scores[i] /= sum;
    } else if (p.scoring == GateScoring::kSigmoid) {
      for (int i = 0; i < e; ++i) scores[i] = 1.0f / (1.0f + std::exp(-logits[i]));
    } else {
      // torch's softplus (beta 1, linear above 20), then its square root.
      for (int i = 0; i < e; ++i) {
        const float x = logits[i];
        scores[i] = std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));
      }
    }
    if (p.forced_ids != nullptr) {
      std::copy(p.forced_ids + static_cast<int64_t>(t) * p.top_k,
                p.forced_ids + static_cast<int64_t>(t + 1) * p.top_k, picked.begin());
    } else {
      Select(p, scores, &choice, &group_score, &groups, &top2, &picked);
    }
    int32_t* ids = p.topk_ids + static_cast<int64_t>(t) * p.top_k;
    float* w = p.topk_weights + static_cast<int64_t>(t) * p.top_k;
    float sum = 0.0f;
    for (int k = 0; k < p.top_k; ++k) {
      ids[k] = picked[k];
      w[k] = scores[picked[k]];
      sum += w[k];
    }
    const float norm = p.renormalize ? 1.0f / (sum + 1e-20f) : 1.0f;
    for (int k = 0; k < p.top_k; ++k) w[k] = w[k] * norm * p.routed_scaling_factor;
  }
}

}  // namespace moesh::cpu
