#include "common/serving/generation_flow.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace moesh {
namespace {

absl::Status CancelledByCaller() { return absl::CancelledError("cancelled by the caller"); }

// Prefills `req` on `prefill` for `decode`, whose reservation is `stream`.
absl::Status Prefill(const GenerationRequest& req, PrefillClient& prefill, DecodeClient& decode,
                     const DecodeStream& stream, const CancelToken& cancel) {
  PrefillSpec ps;
  ps.request_id = req.request_id;
  ps.prompt_ids = req.prompt;
  ps.sampling = req.sampling;
  ps.decode_address = decode.kv_address();
  // What the reservation holds of the prompt already (clamped: a buggy
  // report must not make the prefill worker leave out rows it needs).
  ps.decode_held_tokens =
      std::clamp(stream.held_tokens(), 0, std::max(0, static_cast<int>(req.prompt.size()) - 1));
  if (absl::Status s = prefill.Prefill(ps, cancel); !s.ok() || cancel.cancelled())
    return cancel.cancelled() ? CancelledByCaller() : s;
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckRequestId(absl::string_view id, bool allow_empty) {
  if (id.empty() && !allow_empty) return absl::InvalidArgumentError("request_id is empty");
  if (id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id is ", id.size(), " bytes; the limit is ", kMaxRequestIdBytes));
  }
  return absl::OkStatus();
}

absl::Status RunGeneration(const GenerationRequest& req, PrefillClient* prefill,
                           absl::Span<DecodeClient* const> decoders, const ChunkSink& sink,
                           const CancelToken& cancel, GenerationOutcome* outcome) {
  GenerationOutcome ignored;
  if (outcome == nullptr) outcome = &ignored;
  *outcome = GenerationOutcome();
  DecodeSpec ds = DecodeSpecOf(req);
  ds.compute_prompt = prefill == nullptr;
  DecodeClient* decode = nullptr;
  std::unique_ptr<DecodeStream> stream;
  absl::Status last = absl::ResourceExhaustedError("no decode worker has room");
  for (size_t i = 0; i < decoders.size(); ++i) {
    DecodeClient* d = decoders[i];
    absl::StatusOr<std::unique_ptr<DecodeStream>> opened = d->Open(ds, cancel);
    if (opened.ok()) {
      decode = d;
      outcome->decoder = static_cast<int>(i);
      stream = std::move(*opened);
      break;
    }
    last = opened.status();
    if (cancel.cancelled()) return CancelledByCaller();
    // A full or a vanished worker: the next may take it. Anything else (a
    // duplicate id, a bad size) would fail on every worker.
    if (last.code() != absl::StatusCode::kResourceExhausted &&
        last.code() != absl::StatusCode::kUnavailable) {
      return last;
    }
  }
  if (decode == nullptr) return last;
  if (cancel.cancelled()) return CancelledByCaller();  // `stream` goes: the reservation too
  if (prefill != nullptr) {
    RETURN_IF_ERROR(Prefill(req, *prefill, *decode, *stream, cancel));
    outcome->prefilled = true;
  }
  absl::Status s = stream->Relay(sink);
  return cancel.cancelled() && !s.ok() ? CancelledByCaller() : s;
}

DecodeSpec DecodeSpecOf(const GenerationRequest& req) {
  DecodeSpec ds;
  ds.request_id = req.request_id;
  ds.prompt_ids = req.prompt;
  ds.sampling = req.sampling;
  ds.max_new_tokens = req.max_new_tokens;
  ds.stop_token_ids = req.stop_token_ids;
  ds.priority = req.priority;
  return ds;
}

bool GenerationDone(const GenerationRequest& req, absl::Span<const int32_t> generated) {
  if (static_cast<int>(generated.size()) >= req.max_new_tokens) return true;
  return !generated.empty() && std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(),
                                         generated.back()) != req.stop_token_ids.end();
}

GenerationRequest ContinuationOf(const GenerationRequest& req,
                                 absl::Span<const int32_t> generated) {
  GenerationRequest next = req;
  if (generated.empty()) return next;  // nothing went out yet: the same request again
  next.prompt.insert(next.prompt.end(), generated.begin(), generated.end());
  next.max_new_tokens = req.max_new_tokens - static_cast<int>(generated.size());
  next.sampling.prompt_logprobs = -1;
  if (next.sampling.seed.has_value()) {
    next.sampling.seed =
        Sampler::SeedAtStep(*req.sampling.seed, static_cast<int>(generated.size()));
  }
  return next;
}

}  // namespace moesh
