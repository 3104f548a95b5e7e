#include "common/serving/inprocess_clients.h"

namespace moesh {

absl::Status InProcessDecodeClient::Reserve(const std::string& request_id, int prompt_tokens,
                                            int max_tokens) {
  return engine_->Reserve(request_id, max_tokens);
}

void InProcessDecodeClient::Release(const std::string& request_id) {
  engine_->Release(request_id).IgnoreError();  // best effort: it may have ended
}

absl::Status InProcessDecodeClient::Decode(const DecodeSpec& spec, const TokenSink& sink,
                                           const CancelToken& cancel) {
  // The engine stops on one token: the caller's, or the sink declining.
  CancelToken stop;
  CancelToken::Registration forward = cancel.OnCancel([&stop] { stop.Cancel(); });
  bool declined = false;
  absl::Status s = engine_->Decode(
      spec,
      [&](const TokenEvent& e) {
        if (!declined && !sink(e)) {
          declined = true;
          stop.Cancel();  // the sink runs outside the engine's lock
        }
      },
      stop);
  forward.Reset();
  if (declined && s.code() == absl::StatusCode::kCancelled) return absl::OkStatus();
  return s;
}

}  // namespace moesh
