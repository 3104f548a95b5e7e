#include "common/cuda_backend/sample_rows.h"

#include <algorithm>

#include "kernels/cuda/config.h"

namespace moesh::cuda {

static_assert(sampling::kMinTemperature == kMinSamplingTemperature,
              "the GPU and CPU samplers' greedy threshold");

void AppendSampleRow(const SamplingParams& params, double draw, absl::Span<const int32_t> prompt,
                     absl::Span<const int32_t> output, std::vector<SampleRow>* rows,
                     std::vector<PenaltyEntry>* penalties) {
  SampleRow r;
  r.temperature = params.temperature, r.top_k = params.top_k, r.top_p = params.top_p,
  r.min_p = params.min_p;
  r.repetition_penalty = params.repetition_penalty;
  r.presence_penalty = params.presence_penalty, r.frequency_penalty = params.frequency_penalty;
  r.draw = draw;
  r.penalty_begin = r.penalty_end = static_cast<int>(penalties->size());
  if (params.has_penalties()) {
    // (id, 1 if from the output): sorted, each distinct id becomes one entry.
    std::vector<std::pair<int32_t, int32_t>> toks;
    if (params.repetition_penalty != 1.0f) {
      for (int32_t t : prompt) toks.push_back({t, 0});
    }
    for (int32_t t : output) toks.push_back({t, 1});
    std::sort(toks.begin(), toks.end());
    for (size_t i = 0; i < toks.size();) {
      PenaltyEntry e;
      e.id = toks[i].first;
      for (; i < toks.size() && toks[i].first == e.id; ++i) e.output_count += toks[i].second;
      penalties->push_back(e);
    }
    r.penalty_end = static_cast<int>(penalties->size());
  }
  rows->push_back(r);
}

}  // namespace moesh::cuda
