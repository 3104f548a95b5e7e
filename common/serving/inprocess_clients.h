// The workers' clients for engines in this process (the router's colocated
// mode): direct calls, no RPCs. The engines are borrowed and must outlive the
// clients. Thread-safe.
#ifndef MOESH_COMMON_SERVING_INPROCESS_CLIENTS_H_
#define MOESH_COMMON_SERVING_INPROCESS_CLIENTS_H_

#include <string>

#include "common/serving/decode_engine.h"
#include "common/serving/generation_flow.h"
#include "common/serving/prefill_engine.h"

namespace moesh {

class InProcessPrefillClient : public PrefillClient {
 public:
  explicit InProcessPrefillClient(PrefillEngine* engine) : engine_(engine) {}
  absl::Status Prefill(const PrefillSpec& spec, const CancelToken& cancel) override {
    return engine_->Prefill(spec, &cancel);
  }

 private:
  PrefillEngine* const engine_;
};

class InProcessDecodeClient : public DecodeClient {
 public:
  // `kv_address`: where `engine` is bound for KV (BindInproc).
  InProcessDecodeClient(DecodeEngine* engine, std::string kv_address)
      : engine_(engine), kv_address_(std::move(kv_address)) {}

  const std::string& kv_address() const override { return kv_address_; }
  absl::StatusOr<std::unique_ptr<DecodeStream>> Open(const DecodeSpec& spec,
                                                     const CancelToken& cancel) override;

 private:
  DecodeEngine* const engine_;
  const std::string kv_address_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_SERVING_INPROCESS_CLIENTS_H_
