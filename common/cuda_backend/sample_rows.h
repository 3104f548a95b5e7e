// A request's SamplingParams (common/engine/sampler.h) as a row of the GPU
// sampler (kernels/cuda/routing.h RunSample).
#ifndef MOESH_COMMON_CUDA_BACKEND_SAMPLE_ROWS_H_
#define MOESH_COMMON_CUDA_BACKEND_SAMPLE_ROWS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "common/engine/sampler.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

// Appends the row of one request about to sample with draw `draw`
// (Sampler::Draw), and a penalty entry per distinct token the penalties touch
// (the prompt's and the output's for a repetition penalty, the output's for
// presence/frequency penalties; none without penalties).
// REQUIRES: params valid for the vocabulary, token ids in it.
void AppendSampleRow(const SamplingParams& params, double draw, absl::Span<const int32_t> prompt,
                     absl::Span<const int32_t> output, std::vector<SampleRow>* rows,
                     std::vector<PenaltyEntry>* penalties);

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_SAMPLE_ROWS_H_
