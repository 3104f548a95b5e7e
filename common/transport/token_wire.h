// A sampled token's top log-probabilities on the wire (moesh.v1.TopLogprobs),
// and a prompt's (moesh.v1.PromptLogprobs):
// the KV handoff carries the first token's (kv_wire.h), the services' streams
// every later token's.
#ifndef MOESH_COMMON_TRANSPORT_TOKEN_WIRE_H_
#define MOESH_COMMON_TRANSPORT_TOKEN_WIRE_H_

#include <vector>

#include "common/engine/sampler.h"
#include "moesh/v1/common.pb.h"

namespace moesh {

void LogprobsToProto(const std::vector<TokenLogprob>& top, v1::TopLogprobs* p);
std::vector<TokenLogprob> LogprobsFromProto(const v1::TopLogprobs& p);
// A prompt's log-probabilities (moesh.v1.PromptLogprobs).
void PromptLogprobsToProto(const PromptLogprobs& lp, v1::PromptLogprobs* p);
PromptLogprobs PromptLogprobsFromProto(const v1::PromptLogprobs& p);

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_TOKEN_WIRE_H_
