// The CUDA graphs of a model's decode steps, keyed by (batch bucket, top-k):
// a whole step per graph, or — where a step leaves the GPU at its MoE
// dispatches (a device-resident expert client) — one graph per stretch
// between two dispatches, the dispatches launched between them (piecewise).
// A key's first step runs eagerly (which also makes cuBLASLt's plans), then
// the same work is captured for the steps after.
//
// Not thread-safe: its model's caller's thread, on its model's stream.
#ifndef MOESH_COMMON_CUDA_BACKEND_GRAPH_RUNNER_H_
#define MOESH_COMMON_CUDA_BACKEND_GRAPH_RUNNER_H_

#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace moesh::cuda {

class GraphRunner {
 public:
  using Key = std::pair<int, int>;  // (batch bucket, top-k)
  // Enqueues one step on the stream (eagerly, or into a capture).
  using EnqueueFn = std::function<absl::Status()>;
  // Launches MoE layer `layer`'s dispatch between two piecewise segments.
  using DispatchFn = std::function<absl::Status(int layer)>;

  explicit GraphRunner(cudaStream_t stream) : stream_(stream) {}
  GraphRunner(const GraphRunner&) = delete;
  GraphRunner& operator=(const GraphRunner&) = delete;

  // Replays `key`'s graph, or runs `enqueue` eagerly and captures it. A
  // capture that fails is an error (the eager run has happened).
  absl::Status Run(Key key, const EnqueueFn& enqueue);
  // The same in segments: while capturing, `enqueue` calls CutSegment(layer)
  // at each dispatch; a replay launches the segments with `dispatch(layer)`
  // between them. A key whose capture failed runs eagerly from then on (said
  // once on stderr).
  absl::Status RunPiecewise(Key key, const EnqueueFn& enqueue, const DispatchFn& dispatch);
  // True while RunPiecewise captures (`enqueue` then cuts instead of dispatching).
  bool capturing() const { return capturing_ != nullptr; }
  // Ends the segment being captured at MoE layer `layer`'s dispatch.
  // REQUIRES: capturing().
  absl::Status CutSegment(int layer);
  // True iff the last Run/RunPiecewise replayed a graph.
  bool last_replayed() const { return last_replayed_; }
  void ResetLastReplayed() { last_replayed_ = false; }
  // Drops every graph (after what they captured changed).
  void Clear();

 private:
  struct Graph {
    cudaGraphExec_t exec = nullptr;
    ~Graph() {
      if (exec != nullptr) cudaGraphExecDestroy(exec);
    }
  };
  // segments[i] ends at MoE layer layers[i]'s dispatch; none: capturing
  // failed once for this key, which runs eagerly.
  struct Piecewise {
    std::vector<std::unique_ptr<Graph>> segments;
    std::vector<int> layers;  // segments.size() - 1 entries
  };
  // The capture on the stream ended into a graph, instantiated.
  absl::Status EndCapture(std::unique_ptr<Graph>* out);

  const cudaStream_t stream_;
  std::map<Key, std::unique_ptr<Graph>> whole_;
  std::map<Key, std::unique_ptr<Piecewise>> piecewise_;
  Piecewise* capturing_ = nullptr;  // non-null while a piecewise capture runs
  bool last_replayed_ = false;
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_GRAPH_RUNNER_H_
