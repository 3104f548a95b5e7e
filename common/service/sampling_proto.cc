#include "common/service/sampling_proto.h"

namespace moesh {

SamplingParams SamplingFromProto(const v1::SamplingParams& p) {
  SamplingParams s;
  s.temperature = p.has_temperature() ? p.temperature() : 1.0f;
  s.top_k = p.has_top_k() ? p.top_k() : 0;
  s.top_p = p.has_top_p() ? p.top_p() : 1.0f;
  s.min_p = p.has_min_p() ? p.min_p() : 0.0f;
  if (p.has_seed()) s.seed = p.seed();
  s.repetition_penalty = p.has_repetition_penalty() ? p.repetition_penalty() : 1.0f;
  s.presence_penalty = p.has_presence_penalty() ? p.presence_penalty() : 0.0f;
  s.frequency_penalty = p.has_frequency_penalty() ? p.frequency_penalty() : 0.0f;
  s.top_logprobs = p.has_top_logprobs() ? p.top_logprobs() : 0;
  s.logprobs = p.has_logprobs() && p.logprobs();
  s.prompt_logprobs = p.has_prompt_logprobs() ? p.prompt_logprobs() : -1;
  return s;
}

void SamplingToProto(const SamplingParams& s, v1::SamplingParams* p) {
  p->set_temperature(s.temperature);
  p->set_top_k(s.top_k);
  p->set_top_p(s.top_p);
  p->set_min_p(s.min_p);
  if (s.seed.has_value()) p->set_seed(*s.seed);
  p->set_repetition_penalty(s.repetition_penalty);
  p->set_presence_penalty(s.presence_penalty);
  p->set_frequency_penalty(s.frequency_penalty);
  p->set_top_logprobs(s.top_logprobs);
  if (s.logprobs) p->set_logprobs(true);
  if (s.prompt_logprobs >= 0) p->set_prompt_logprobs(s.prompt_logprobs);
}

}  // namespace moesh
