#include "common/transport/token_wire.h"

namespace moesh {

void LogprobsToProto(const std::vector<TokenLogprob>& top, v1::TopLogprobs* p) {
  for (const TokenLogprob& t : top) {
    v1::TokenLogprob* c = p->add_candidates();
    c->set_id(t.id);
    c->set_logprob(t.logprob);
  }
}

std::vector<TokenLogprob> LogprobsFromProto(const v1::TopLogprobs& p) {
  std::vector<TokenLogprob> top;
  top.reserve(p.candidates_size());
  for (const v1::TokenLogprob& c : p.candidates()) top.push_back({c.id(), c.logprob()});
  return top;
}

}  // namespace moesh
