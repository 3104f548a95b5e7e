// CudaModel's decode steps as CUDA graphs (common/cuda_backend/graph_runner.h):
// one graph per (batch bucket, top-k) with the experts on the device, and,
// with a device-resident expert client, one per stretch between two MoE
// dispatches (piecewise), the dispatches launched between them.
#include "common/cuda_backend/cuda_model.h"

namespace moesh::cuda {

absl::Status CudaModel::RunDecodeGraph(const StepBatch& b, int top_k) {
  return graphs_->Run({b.num_tokens, top_k}, [&] { return EnqueueForward(b, true, top_k); });
}

absl::Status CudaModel::RunPiecewiseGraph(const StepBatch& b, int top_k, ExpertClient* experts) {
  const int dispatched = b.real_tokens >= 0 ? b.real_tokens : b.num_tokens;
  return graphs_->RunPiecewise(
      {b.num_tokens, top_k}, [&] { return EnqueueForward(b, true, top_k, experts); },
      [&](int layer) { return ffn_->LaunchDeviceDispatch(layer, dispatched, experts); });
}

}  // namespace moesh::cuda
