// Routing and token selection on the GPU: the MoE gate (kernels/cpu/moe_gate.h
// semantics, ties to the lower expert index), greedy argmax with top-k
// log-probabilities (common/engine/sampler.cc TopLogprobs semantics) and
// sampling (Sampler::SampleWithDraw semantics).
//
// Entry points check shapes once, launch on params.stream, and return
// INVALID_ARGUMENT or INTERNAL carrying the CUDA error.
#ifndef MOESH_KERNELS_CUDA_ROUTING_H_
#define MOESH_KERNELS_CUDA_ROUTING_H_

#include "absl/status/status.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

// REQUIRES (else INVALID_ARGUMENT): num_experts in [top_k, gate::kMaxExperts],
// top_k in [1, gate::kMaxTopK], num_experts % n_group == 0,
// 1 <= topk_group <= n_group <= gate::kMaxGroups.
absl::Status RunMoeGate(const MoeGateParams& p);

// REQUIRES: vocab >= max(top_k, 1), top_k <= sampling::kMaxTopK.
absl::Status RunGreedyLogprobs(const GreedyLogprobsParams& p);

// REQUIRES: vocab >= 1; each row's parameters valid (SamplingParams::Validate),
// draw in [0, 1), penalty ids in [0, vocab). Ids are Sampler::SampleWithDraw's
// on the same logits except where the draw or the top-p mass lies within
// about 1e-7 of a candidate boundary (float masses here, double there).
absl::Status RunSample(const SampleParams& p);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_ROUTING_H_
