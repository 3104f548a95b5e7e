// CudaModel's decode steps as CUDA graphs (common/cuda_backend/graph_runner.h):
// one graph per (batch bucket, top-k) with the experts on the device, and,
// with a device-resident expert client, one per stretch between two MoE
// dispatches (piecewise), the dispatches launched between them.
#include "common/cuda_backend/cuda_model.h"

namespace moesh::cuda {

absl::Status CudaModel::RunDecodeGraph(const Batch& b, int top_k) {
  return graphs_->Run({b.num_tokens, top_k}, [&] { return EnqueueForward(b, true, top_k); });
}

absl::Status CudaModel::RunPiecewiseGraph(const Batch& b, int top_k, ExpertClient* experts) {
  const ModelConfig& c = config_;
  return graphs_->RunPiecewise(
      {b.num_tokens, top_k}, [&] { return EnqueueForward(b, true, top_k, experts); },
      [&](int layer) {
        DeviceMoeDispatch d;  // starts once the event recorded inside the segment fires
        d.layer = layer, d.num_tokens = b.real_tokens >= 0 ? b.real_tokens : b.num_tokens;
        d.hidden = c.hidden_size, d.top_k = c.num_experts_per_tok;
        d.hidden_states = reinterpret_cast<const uint16_t*>(normed_.get());
        d.topk_ids = topk_ids_.get(), d.topk_weights = topk_w_.get();
        d.ready = dispatch_copied_.get(), d.stream = stream_.get();
        return experts->RunOnDevice(d, moe_out_.get());
      });
}

}  // namespace moesh::cuda
