#include "common/cuda_backend/graph_runner.h"

#include <iostream>

#include "base/status.h"
#include "kernels/cuda/cuda_status.h"

namespace moesh::cuda {

absl::Status GraphRunner::EndCapture(std::unique_ptr<Graph>* out) {
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  if (end != cudaSuccess) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    return CudaStatus(end, "cudaStreamEndCapture");
  }
  auto g = std::make_unique<Graph>();
  const cudaError_t inst = cudaGraphInstantiate(&g->exec, graph, 0);
  cudaGraphDestroy(graph);
  RETURN_IF_CUDA_ERROR(inst);
  *out = std::move(g);
  return absl::OkStatus();
}

absl::Status GraphRunner::Run(Key key, const EnqueueFn& enqueue) {
  auto it = whole_.find(key);
  if (it != whole_.end()) {
    last_replayed_ = true;
    return CudaStatus(cudaGraphLaunch(it->second->exec, stream_), "cudaGraphLaunch");
  }
  RETURN_IF_ERROR(enqueue());
  RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  const absl::Status captured = enqueue();  // capturing runs nothing
  std::unique_ptr<Graph> g;
  const absl::Status ended = EndCapture(&g);
  RETURN_IF_ERROR(captured);
  RETURN_IF_ERROR(ended);
  whole_[key] = std::move(g);
  return absl::OkStatus();
}

absl::Status GraphRunner::CutSegment(int layer) {
  std::unique_ptr<Graph> g;
  RETURN_IF_ERROR(EndCapture(&g));
  capturing_->segments.push_back(std::move(g));
  capturing_->layers.push_back(layer);
  RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  return absl::OkStatus();
}

absl::Status GraphRunner::RunPiecewise(Key key, const EnqueueFn& enqueue,
                                       const DispatchFn& dispatch) {
  auto it = piecewise_.find(key);
  if (it == piecewise_.end()) {
    RETURN_IF_ERROR(enqueue());
    auto pw = std::make_unique<Piecewise>();
    RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    capturing_ = pw.get();
    absl::Status captured = enqueue();
    capturing_ = nullptr;
    std::unique_ptr<Graph> last;  // the last segment (or what a failure left)
    const absl::Status ended = EndCapture(&last);
    if (captured.ok()) captured = ended;
    if (captured.ok()) pw->segments.push_back(std::move(last));
    if (!captured.ok()) {  // the eager run stands; this key stays eager
      std::cerr << "CudaModel: decode steps of " << key.first
                << " rows run without CUDA graphs: " << captured << std::endl;
      cudaGetLastError();
      pw = std::make_unique<Piecewise>();
    }
    piecewise_[key] = std::move(pw);
    return absl::OkStatus();
  }
  const Piecewise& pw = *it->second;
  if (pw.segments.empty()) return enqueue();
  for (size_t i = 0; i < pw.segments.size(); ++i) {
    RETURN_IF_CUDA_ERROR(cudaGraphLaunch(pw.segments[i]->exec, stream_));
    if (i == pw.layers.size()) break;
    RETURN_IF_ERROR(dispatch(pw.layers[i]));
  }
  last_replayed_ = true;
  return absl::OkStatus();
}

void GraphRunner::Clear() {
  whole_.clear();
  piecewise_.clear();
}

}  // namespace moesh::cuda
