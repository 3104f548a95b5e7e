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

void PromptLogprobsToProto(const PromptLogprobs& lp, v1::PromptLogprobs* p) {
  p->mutable_logprobs()->Add(lp.logprobs.begin(), lp.logprobs.end());
  for (const std::vector<TokenLogprob>& top : lp.top) LogprobsToProto(top, p->add_top());
}

PromptLogprobs PromptLogprobsFromProto(const v1::PromptLogprobs& p) {
  PromptLogprobs lp;
  lp.logprobs.assign(p.logprobs().begin(), p.logprobs().end());
  for (const v1::TopLogprobs& top : p.top()) lp.top.push_back(LogprobsFromProto(top));
  return lp;
}

}  // namespace moesh
