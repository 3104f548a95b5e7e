#include "common/serving/generation_flow.h"

#include "absl/strings/str_cat.h"

namespace moesh {
namespace {

absl::Status CancelledByCaller() { return absl::CancelledError("cancelled by the caller"); }

}  // namespace

absl::Status CheckRequestId(absl::string_view id, bool allow_empty) {
  if (id.empty() && !allow_empty) return absl::InvalidArgumentError("request_id is empty");
  if (id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id is ", id.size(), " bytes; the limit is ", kMaxRequestIdBytes));
  }
  return absl::OkStatus();
}

absl::Status RunGeneration(const GenerationRequest& req, PrefillClient& prefill,
                           absl::Span<DecodeClient* const> decoders, const ChunkSink& sink,
                           const CancelToken& cancel) {
  DecodeSpec ds;
  ds.request_id = req.request_id;
  ds.prompt_ids = req.prompt;
  ds.sampling = req.sampling;
  ds.max_new_tokens = req.max_new_tokens;
  ds.stop_token_ids = req.stop_token_ids;
  ds.priority = req.priority;
  DecodeClient* decode = nullptr;
  std::unique_ptr<DecodeStream> stream;
  absl::Status last = absl::ResourceExhaustedError("no decode worker has room");
  for (DecodeClient* d : decoders) {
    absl::StatusOr<std::unique_ptr<DecodeStream>> opened = d->Open(ds, cancel);
    if (opened.ok()) {
      decode = d;
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

  PrefillSpec ps;
  ps.request_id = req.request_id;
  ps.prompt_ids = req.prompt;
  ps.sampling = req.sampling;
  ps.decode_address = decode->kv_address();
  if (absl::Status s = prefill.Prefill(ps, cancel); !s.ok() || cancel.cancelled())
    return cancel.cancelled() ? CancelledByCaller() : s;
  absl::Status s = stream->Relay(sink);
  return cancel.cancelled() && !s.ok() ? CancelledByCaller() : s;
}

}  // namespace moesh
