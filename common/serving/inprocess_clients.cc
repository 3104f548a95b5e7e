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
                                           const CancelledFn& cancelled) {
  bool declined = false;
  absl::Status s = engine_->Decode(
      spec,
      [&](const TokenEvent& e) {
        if (!declined && !sink(e)) declined = true;
      },
      [&] { return declined || cancelled(); });
  if (declined && s.code() == absl::StatusCode::kCancelled) return absl::OkStatus();
  return s;
}

}  // namespace moesh
