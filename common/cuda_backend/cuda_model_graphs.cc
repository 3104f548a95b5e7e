// CudaModel's CUDA graphs for decode steps: one graph per (batch bucket,
// top-k) with the experts on the device, and, with a device-resident expert
// client, one graph per stretch between two MoE dispatches (piecewise).
#include <iostream>

#include "common/cuda_backend/cuda_model.h"
#include "kernels/cuda/cuda_status.h"

namespace moesh::cuda {

absl::Status CudaModel::RunDecodeGraph(const Batch& b, int top_k) {
  const auto key = std::make_pair(b.num_tokens, top_k);
  auto it = graphs_.find(key);
  if (it != graphs_.end()) {
    last_step_used_graph_ = true;
    return CudaStatus(cudaGraphLaunch(it->second->exec, stream_.get()), "cudaGraphLaunch");
  }
  // First use of the bucket: run eagerly (which also creates the cuBLASLt
  // plans), then capture the same work for the next steps; capturing runs nothing.
  RETURN_IF_ERROR(EnqueueForward(b, true, top_k));
  cudaStream_t s = stream_.get();
  RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const absl::Status captured = EnqueueForward(b, true, top_k);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  RETURN_IF_ERROR(captured);
  RETURN_IF_CUDA_ERROR(end);
  auto g = std::make_unique<Graph>();
  const cudaError_t inst = cudaGraphInstantiate(&g->exec, graph, 0);
  cudaGraphDestroy(graph);
  RETURN_IF_CUDA_ERROR(inst);
  graphs_[key] = std::move(g);
  return absl::OkStatus();
}

absl::Status CudaModel::CutSegment(int layer) {
  cudaStream_t s = stream_.get();
  cudaGraph_t graph = nullptr;
  RETURN_IF_CUDA_ERROR(cudaStreamEndCapture(s, &graph));
  auto g = std::make_unique<Graph>();
  const cudaError_t inst = cudaGraphInstantiate(&g->exec, graph, 0);
  cudaGraphDestroy(graph);
  RETURN_IF_CUDA_ERROR(inst);
  capturing_->segments.push_back(std::move(g));
  capturing_->layers.push_back(layer);
  RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  return absl::OkStatus();
}

absl::Status CudaModel::RunPiecewiseGraph(const Batch& b, int top_k, ExpertClient* experts) {
  const auto key = std::make_pair(b.num_tokens, top_k);
  auto it = piecewise_.find(key);
  if (it == piecewise_.end()) {
    // First use of the bucket: run eagerly, then capture the segments (capturing runs nothing).
    RETURN_IF_ERROR(EnqueueForward(b, true, top_k, experts));
    cudaStream_t s = stream_.get();
    auto pw = std::make_unique<PiecewiseGraph>();
    RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    capturing_ = pw.get();
    absl::Status captured = EnqueueForward(b, true, top_k, experts);
    capturing_ = nullptr;
    cudaGraph_t graph = nullptr;
    const cudaError_t end =
        cudaStreamEndCapture(s, &graph);  // the last segment (or what a failure left)
    if (captured.ok() && end == cudaSuccess) {
      auto g = std::make_unique<Graph>();
      const cudaError_t inst = cudaGraphInstantiate(&g->exec, graph, 0);
      if (inst == cudaSuccess) pw->segments.push_back(std::move(g));
      captured = CudaStatus(inst, "cudaGraphInstantiate");
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (captured.ok() && end != cudaSuccess) captured = CudaStatus(end, "cudaStreamEndCapture");
    if (!captured.ok()) {  // the eager run stands; this bucket stays eager
      std::cerr << "CudaModel: decode steps of " << b.num_tokens
                << " rows run without CUDA graphs: " << captured << std::endl;
      cudaGetLastError();
      pw = std::make_unique<PiecewiseGraph>();
    }
    piecewise_[key] = std::move(pw);
    return absl::OkStatus();
  }
  const PiecewiseGraph& pw = *it->second;
  if (pw.segments.empty()) return EnqueueForward(b, true, top_k, experts);
  const ModelConfig& c = config_;
  for (size_t i = 0; i < pw.segments.size(); ++i) {
    RETURN_IF_CUDA_ERROR(cudaGraphLaunch(pw.segments[i]->exec, stream_.get()));
    if (i == pw.layers.size()) break;
    DeviceMoeDispatch d;  // starts once the event recorded inside the segment fires
    d.layer = pw.layers[i], d.num_tokens = b.real_tokens >= 0 ? b.real_tokens : b.num_tokens;
    d.hidden = c.hidden_size, d.top_k = c.num_experts_per_tok;
    d.hidden_states = reinterpret_cast<const uint16_t*>(normed_.get());
    d.topk_ids = topk_ids_.get(), d.topk_weights = topk_w_.get();
    d.ready = dispatch_copied_.get(), d.stream = stream_.get();
    RETURN_IF_ERROR(experts->RunOnDevice(d, moe_out_.get()));
  }
  last_step_used_graph_ = true;
  return absl::OkStatus();
}

}  // namespace moesh::cuda
