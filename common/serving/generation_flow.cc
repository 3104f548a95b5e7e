#include "common/serving/generation_flow.h"

#include <algorithm>

namespace moesh {
namespace {

absl::Status CancelledByCaller() { return absl::CancelledError("cancelled by the caller"); }

}  // namespace

absl::Status RunGeneration(const GenerationRequest& req, PrefillClient& prefill,
                           absl::Span<DecodeClient* const> decoders, const ChunkSink& sink,
                           const CancelToken& cancel) {
  const int prompt_tokens = static_cast<int>(req.prompt.size());
  const int max_tokens = prompt_tokens + req.max_new_tokens - 1;
  DecodeClient* decode = nullptr;
  absl::Status last = absl::ResourceExhaustedError("no decode worker has room");
  for (DecodeClient* d : decoders) {
    absl::Status s = d->Reserve(req.request_id, prompt_tokens, max_tokens);
    if (s.ok()) {
      decode = d;
      break;
    }
    last = std::move(s);
    // A full or a vanished worker: the next may take it. Anything else (a
    // duplicate id, a bad size) would fail on every worker.
    if (last.code() != absl::StatusCode::kResourceExhausted &&
        last.code() != absl::StatusCode::kUnavailable) {
      return last;
    }
  }
  if (decode == nullptr) return last;
  if (cancel.cancelled()) {
    decode->Release(req.request_id);
    return CancelledByCaller();
  }

  PrefillSpec ps;
  ps.request_id = req.request_id;
  ps.prompt_ids = req.prompt;
  ps.sampling = req.sampling;
  ps.decode_address = decode->kv_address();
  absl::StatusOr<PrefillResult> first = prefill.Prefill(ps, cancel);
  if (!first.ok() || cancel.cancelled()) {
    decode->Release(req.request_id);
    return cancel.cancelled() ? CancelledByCaller() : first.status();
  }
  TokenChunk chunk;
  chunk.queue_seconds = first->queue_seconds;
  chunk.ids.push_back(first->first_token);
  if (req.sampling.top_logprobs > 0) chunk.logprobs.push_back(std::move(first->logprobs));
  const bool stops = std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(),
                               first->first_token) != req.stop_token_ids.end();
  if (!sink(chunk) || stops || req.max_new_tokens <= 1) {
    decode->Release(req.request_id);
    return absl::OkStatus();
  }

  DecodeSpec ds;
  ds.request_id = req.request_id;
  ds.prompt_ids = req.prompt;
  ds.first_token = first->first_token;
  ds.sampling = req.sampling;
  ds.max_new_tokens = req.max_new_tokens;
  ds.stop_token_ids = req.stop_token_ids;
  return decode->Decode(
      ds,
      [&sink](const TokenEvent& e) {
        return e.ids.empty() || sink(e);  // empty: the closing event of a finished request
      },
      cancel);
}

}  // namespace moesh
