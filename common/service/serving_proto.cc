#include "common/service/serving_proto.h"

#include "common/service/sampling_proto.h"
#include "common/transport/token_wire.h"

namespace moesh {

namespace {

// What a prefill and a decode request share: the request id, its prompt and
// its sampling.
template <typename Spec, typename Proto>
void RequestToProto(const Spec& spec, Proto* p) {
  p->set_request_id(spec.request_id);
  p->mutable_prompt_ids()->Add(spec.prompt_ids.begin(), spec.prompt_ids.end());
  SamplingToProto(spec.sampling, p->mutable_sampling());
}
template <typename Spec, typename Proto>
Spec RequestFromProto(const Proto& p) {
  Spec spec;
  spec.request_id = p.request_id();
  spec.prompt_ids.assign(p.prompt_ids().begin(), p.prompt_ids().end());
  spec.sampling = SamplingFromProto(p.sampling());
  return spec;
}

}  // namespace

void PrefillSpecToProto(const PrefillSpec& spec, v1::PrefillRequest* p) {
  RequestToProto(spec, p);
  p->set_decode_address(spec.decode_address);
  p->set_decode_held_tokens(spec.decode_held_tokens);
}

PrefillSpec PrefillSpecFromProto(const v1::PrefillRequest& p) {
  PrefillSpec spec = RequestFromProto<PrefillSpec>(p);
  spec.decode_address = p.decode_address();
  spec.decode_held_tokens = p.decode_held_tokens();
  return spec;
}

void DecodeSpecToProto(const DecodeSpec& spec, v1::DecodeRequest* p) {
  RequestToProto(spec, p);
  p->set_max_new_tokens(spec.max_new_tokens);
  p->mutable_stop_token_ids()->Add(spec.stop_token_ids.begin(), spec.stop_token_ids.end());
  p->set_priority(spec.priority);
  p->set_compute_prompt(spec.compute_prompt);
}

DecodeSpec DecodeSpecFromProto(const v1::DecodeRequest& p) {
  DecodeSpec spec = RequestFromProto<DecodeSpec>(p);
  spec.max_new_tokens = p.max_new_tokens();
  spec.stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  spec.priority = p.priority();
  spec.compute_prompt = p.compute_prompt();
  return spec;
}

void TokenEventToProto(const TokenEvent& event, v1::DecodeResponse* p) {
  p->mutable_token_ids()->Add(event.ids.begin(), event.ids.end());
  for (const std::vector<TokenLogprob>& top : event.logprobs)
    LogprobsToProto(top, p->add_logprobs());
  p->set_finished(event.finished);
  p->set_stopped(event.stopped);
  p->set_queue_seconds(event.queue_seconds);
  p->mutable_token_logprobs()->Add(event.token_logprobs.begin(), event.token_logprobs.end());
  if (event.prompt_logprobs.has_value())
    PromptLogprobsToProto(*event.prompt_logprobs, p->mutable_prompt_logprobs());
  p->set_cached_tokens(event.cached_tokens);
}

TokenEvent TokenEventFromProto(const v1::DecodeResponse& p) {
  TokenEvent event;
  event.ids.assign(p.token_ids().begin(), p.token_ids().end());
  for (const v1::TopLogprobs& top : p.logprobs()) event.logprobs.push_back(LogprobsFromProto(top));
  event.finished = p.finished();
  event.stopped = p.stopped();
  event.queue_seconds = p.queue_seconds();
  event.token_logprobs.assign(p.token_logprobs().begin(), p.token_logprobs().end());
  if (p.has_prompt_logprobs()) event.prompt_logprobs = PromptLogprobsFromProto(p.prompt_logprobs());
  event.cached_tokens = p.cached_tokens();
  return event;
}

v1::WorkerLoad LoadToProto(const ServingLoad& load) {
  v1::WorkerLoad p;
  p.set_queued_prompt_tokens(load.queued_prompt_tokens);
  p.set_num_running(load.num_running);
  p.set_kv_usage(static_cast<float>(load.kv_usage));
  p.set_free_kv_blocks(load.free_kv_blocks);
  p.set_draining(load.draining);
  if (!load.cached_block_hashes.empty()) {
    p.mutable_cached_block_hashes()->Add(load.cached_block_hashes.begin(),
                                         load.cached_block_hashes.end());
    p.set_cache_block_size(load.cache_block_size);
  }
  return p;
}

}  // namespace moesh
