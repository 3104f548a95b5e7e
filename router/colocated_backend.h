// Colocated serving: prefill, decode and every expert in this process. The
// reference the disaggregated cluster must equal, and the small-deployment
// mode. Thread-safe. Two ways, by the decode options' max_num_batched_tokens:
//   * > 0, chunked prefill: one engine, one scheduler. The decode engine
//     computes each prompt itself (DecodeSpec::compute_prompt), in chunks
//     that fill its steps' token budget after the running decodes
//     (RunComputingPrompt); there is no prefill engine.
//   * 0: a prefill engine and the decode engine share the KV pool, joined by
//     the inproc transport; requests take the cluster's flow
//     (common/serving/generation_flow.h) over in-process clients: a prompt
//     runs whole in the prefill engine's pass, besides the decode steps.
#ifndef MOESH_ROUTER_COLOCATED_BACKEND_H_
#define MOESH_ROUTER_COLOCATED_BACKEND_H_

#include <memory>
#include <string>

#include "common/service/attention_worker.h"
#include "common/serving/decode_engine.h"
#include "common/serving/inprocess_clients.h"
#include "common/serving/prefill_engine.h"
#include "router/backend.h"

namespace moesh {

class ColocatedBackend : public GenerationBackend {
 public:
  // One attention backend on `device` (its KV pool) serves the engines.
  static absl::StatusOr<std::unique_ptr<ColocatedBackend>> Create(
      const std::string& model_dir, const DeviceOptions& device, DecodeEngineOptions decode_options,
      PrefillEngineOptions prefill_options);
  ~ColocatedBackend() override;

  absl::Status Run(const GenerationRequest& request, const ChunkSink& sink,
                   const CancelToken& cancel) override;
  bool Ready() const override { return true; }
  const ModelConfig& config() const { return worker_.config; }
  DecodeEngine* decode() { return decode_.get(); }

 private:
  explicit ColocatedBackend(AttentionWorker worker) : worker_(std::move(worker)) {}

  AttentionWorker worker_;
  std::string inproc_address_;
  std::unique_ptr<DecodeEngine> decode_;
  std::unique_ptr<PrefillEngine> prefill_;  // null with chunked prefill
  std::unique_ptr<InProcessPrefillClient> prefill_client_;
  std::unique_ptr<InProcessDecodeClient> decode_client_;
};

}  // namespace moesh

#endif  // MOESH_ROUTER_COLOCATED_BACKEND_H_
