#include "common/serving/inprocess_clients.h"

#include <utility>

namespace moesh {
namespace {

class InProcessDecodeStream : public DecodeStream {
 public:
  InProcessDecodeStream(DecodeEngine* engine, std::shared_ptr<DecodeEngine::Request> request,
                        const CancelToken& cancel)
      : engine_(engine), request_(std::move(request)), cancel_(cancel) {}
  ~InProcessDecodeStream() override {
    if (!relayed_) engine_->Release(request_);
  }

  absl::Status Relay(const TokenSink& sink) override {
    relayed_ = true;
    // The engine stops on one token: the caller's, or the sink declining.
    CancelToken stop;
    CancelToken::Registration forward = cancel_.OnCancel([&stop] { stop.Cancel(); });
    bool declined = false;
    absl::Status s = engine_->Decode(
        request_,
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
  int held_tokens() const override { return engine_->HeldTokens(*request_); }

 private:
  DecodeEngine* const engine_;
  const std::shared_ptr<DecodeEngine::Request> request_;
  const CancelToken& cancel_;
  bool relayed_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DecodeStream>> InProcessDecodeClient::Open(
    const DecodeSpec& spec, const CancelToken& cancel) {
  absl::StatusOr<std::shared_ptr<DecodeEngine::Request>> request = engine_->Reserve(spec, &cancel);
  if (!request.ok()) return request.status();
  return std::make_unique<InProcessDecodeStream>(engine_, std::move(*request), cancel);
}

}  // namespace moesh
