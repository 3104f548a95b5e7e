// CudaModel's routed experts behind an ExpertClient (an attention worker
// with remote expert workers): the dispatch of each MoE layer, device-resident
// where the client takes device buffers (cuda_ipc, nccl) or through the host,
// and the check, after a chunk, that the workers' results were sound.
#include <functional>

#include "absl/strings/str_cat.h"
#include "common/cuda_backend/cuda_model.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/ops.h"

namespace moesh::cuda {

absl::Status CudaModel::RunExternalExperts(int layer, int num_tokens, ExpertClient* experts) {
  const ModelConfig& c = config_;
  const DeviceLayerWeights& w = weights_->layer(layer);
  cudaStream_t s = stream_.get();
  const size_t h = c.hidden_size, k = c.num_experts_per_tok, t = num_tokens;
  if (experts->dispatch_device() == info_.device) {
    // Device-resident (cuda_ipc): the bf16 hidden states, ids and weights
    // stay in this GPU's memory; the experts' sum comes back into moe_out_.
    // (Captured piecewise: the dispatch happens between the segments.)
    if (graphs_->capturing()) {
      RETURN_IF_CUDA_ERROR(
          cudaEventRecordWithFlags(dispatch_copied_.get(), s, cudaEventRecordExternal));
    } else {
      RETURN_IF_ERROR(dispatch_copied_.Record(s));
    }
    if (w.shared_gate_up != nullptr) {  // runs while the experts work
      RETURN_IF_ERROR(
          EnqueueMlp(w.shared_gate_up, w.shared_down, weights_->shared_intermediate(), num_tokens));
    }
    if (graphs_->capturing()) {
      RETURN_IF_ERROR(graphs_->CutSegment(layer));
    } else {
      // No host wait: the transport starts once the event fires and hands
      // the sum back on this stream.
      DeviceMoeDispatch d;  // the padding rows of a decode batch stay home
      d.layer = layer, d.num_tokens = dispatch_tokens_, d.hidden = c.hidden_size,
      d.top_k = c.num_experts_per_tok;
      d.hidden_states = reinterpret_cast<const uint16_t*>(normed_.get());
      d.topk_ids = topk_ids_.get(), d.topk_weights = topk_w_.get();
      d.ready = dispatch_copied_.get(), d.stream = s;
      RETURN_IF_ERROR(experts->RunOnDevice(d, moe_out_.get()));
    }
    MoeCombineParams cp;  // x += routed (already weighted and summed over k)
    cp.expert_out = moe_out_.get(), cp.num_tokens = num_tokens, cp.top_k = 1,
    cp.hidden = c.hidden_size;
    cp.x = resid_, cp.stream = s;
    return RunMoeCombine(cp);
  }
  // The dispatch: the fp32 normalised hidden states (the CPU model's input to
  // its experts), the top-k ids and weights.
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(h_hidden_.get(), normed_f32_.get(), t * h * sizeof(float),
                                       cudaMemcpyDeviceToHost, s));
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(h_topk_ids_.get(), topk_ids_.get(), t * k * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, s));
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(h_topk_w_.get(), topk_w_.get(), t * k * sizeof(float),
                                       cudaMemcpyDeviceToHost, s));
  RETURN_IF_ERROR(dispatch_copied_.Record(s));
  // The shared expert runs on the device while the routed experts are away.
  if (w.shared_gate_up != nullptr) {
    RETURN_IF_ERROR(
        EnqueueMlp(w.shared_gate_up, w.shared_down, weights_->shared_intermediate(), num_tokens));
  }
  RETURN_IF_ERROR(dispatch_copied_.Synchronize());
  MoeDispatch d;
  d.layer = layer, d.num_tokens = num_tokens, d.hidden = c.hidden_size,
  d.top_k = c.num_experts_per_tok;
  d.hidden_states = h_hidden_.get(), d.topk_ids = h_topk_ids_.get(),
  d.topk_weights = h_topk_w_.get();
  std::unique_ptr<PendingDispatch> pending = experts->Start(d, h_routed_.get());
  RETURN_IF_ERROR(pending->Wait());
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(moe_out_.get(), h_routed_.get(), t * h * sizeof(float),
                                       cudaMemcpyHostToDevice, s));
  MoeCombineParams cp;  // x += routed (already weighted and summed over k)
  cp.expert_out = moe_out_.get(), cp.num_tokens = num_tokens, cp.top_k = 1,
  cp.hidden = c.hidden_size;
  cp.x = resid_, cp.stream = s;
  RETURN_IF_ERROR(RunMoeCombine(cp));
  // The host buffers are reused by the next layer: wait for the upload.
  return stream_.Synchronize();
}

absl::Status CudaModel::RunChecked(ExpertClient* experts,
                                   const std::function<absl::Status()>& run) {
  for (int attempt = 0;; ++attempt) {
    RETURN_IF_ERROR(run());
    if (experts == nullptr) return absl::OkStatus();
    const absl::Status checked = experts->CheckDeviceDispatches();
    if (checked.ok() || checked.code() != absl::StatusCode::kUnavailable || attempt > 0)
      return checked;
    // The chunk rewrites the same cache rows and draws the same samples.
    std::cerr << "CudaModel: an expert worker failed under this step (" << checked.message()
              << "); running the step again on the other replicas" << std::endl;
  }
}

}  // namespace moesh::cuda
