#include "common/cuda_backend/ffn_block.h"

#include <algorithm>
#include <iostream>

#include "base/status.h"
#include "kernels/cuda/expert_mlp.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/routing.h"

namespace moesh::cuda {
namespace {

GateSelect SelectOf(TopkMethod m) {
  switch (m) {
    case TopkMethod::kGreedy:
      return GateSelect::kGreedy;
    case TopkMethod::kGroupLimitedGreedy:
      return GateSelect::kGroupMax;
    case TopkMethod::kNoauxTc:
      return GateSelect::kGroupTop2Sum;
  }
  return GateSelect::kGreedy;
}

}  // namespace

absl::StatusOr<std::unique_ptr<FfnBlock>> FfnBlock::Create(const ForwardContext& ctx) {
  std::unique_ptr<FfnBlock> f(new FfnBlock(ctx));
  RETURN_IF_ERROR(f->Init());
  return f;
}

absl::Status FfnBlock::Init() {
  const ModelConfig& c = ctx_.config;
  const CudaModelOptions& o = ctx_.options;
  const size_t t = ctx_.max_tokens, h = c.hidden_size;
  const int mlp_inter = std::max(c.intermediate_size, ctx_.weights->shared_intermediate());
  const int e = std::max(c.n_routed_experts, 1), k = std::max(c.num_experts_per_tok, 1);
  const int moe_inter = std::max(c.moe_intermediate_size, 1);
  RETURN_IF_ERROR(mlp_gu_.Reallocate(t * 2 * mlp_inter));
  RETURN_IF_ERROR(mlp_act_.Reallocate(t * mlp_inter));
  RETURN_IF_ERROR(router_logits_.Reallocate(t * e));
  RETURN_IF_ERROR(topk_ids_.Reallocate(t * k));
  RETURN_IF_ERROR(topk_w_.Reallocate(t * k));
  RETURN_IF_ERROR(row_token_.Reallocate(t * k));
  RETURN_IF_ERROR(pair_row_.Reallocate(t * k));
  RETURN_IF_ERROR(expert_offsets_.Reallocate(e + 1));
  RETURN_IF_ERROR(tile_offsets_.Reallocate(e + 1));
  RETURN_IF_ERROR(expert_counts_.Reallocate(static_cast<size_t>(c.num_hidden_layers) * e));
  RETURN_IF_CUDA_ERROR(
      cudaMemsetAsync(expert_counts_.get(), 0, expert_counts_.bytes(), ctx_.stream));
  if (o.record_routing) {
    RETURN_IF_ERROR(routing_log_.Reallocate(static_cast<size_t>(c.num_hidden_layers) * t * k));
    RETURN_IF_CUDA_ERROR(
        cudaMemsetAsync(routing_log_.get(), 0xff, routing_log_.bytes(), ctx_.stream));
  }
  if (o.routed_experts_on_device) {
    // kDenseRowAlign rows of slack: the per-expert dense GEMMs' last spill (expert_mlp.h).
    const size_t rows = t * k + kDenseRowAlign;
    RETURN_IF_ERROR(moe_gu_.Reallocate(rows * 2 * moe_inter));
    RETURN_IF_ERROR(moe_act_.Reallocate(rows * moe_inter));
    RETURN_IF_ERROR(moe_out_.Reallocate(rows * h));
    if (o.fp8_expert_act && c.n_routed_experts > 0 && Fp8ActivationWidths(h, moe_inter) &&
        RoutedExpertFormat(c, ctx_.weights->fp8_linears()) == LinearFormat::kFp8) {
      const int pairs = static_cast<int>(t * k);
      RETURN_IF_ERROR(moe_act_fp8_.Reallocate(Fp8ActivationCodes(pairs, h, moe_inter)));
      RETURN_IF_ERROR(moe_act_fp8_scale_.Reallocate(Fp8ActivationScales(pairs, h, moe_inter)));
    }
    if (t * k >= static_cast<size_t>(kDenseRowsPerExpert) * e) {  // large enough for the dense path
      RETURN_IF_ERROR(moe_gathered_.Reallocate(rows * h));
      ASSIGN_OR_RETURN(h_expert_offsets_, PinnedBuffer<int32_t>::Create(e + 1));
    }
  } else {
    RETURN_IF_ERROR(moe_out_.Reallocate(t * h));  // the external experts' combined output
    // Decode padding rows are not dispatched: keep their (ignored) rows finite.
    RETURN_IF_CUDA_ERROR(cudaMemset(moe_out_.get(), 0, moe_out_.bytes()));
    ASSIGN_OR_RETURN(h_hidden_, PinnedBuffer<float>::Create(t * h));
    ASSIGN_OR_RETURN(h_routed_, PinnedBuffer<float>::Create(t * h));
    ASSIGN_OR_RETURN(h_topk_w_, PinnedBuffer<float>::Create(t * k));
    ASSIGN_OR_RETURN(h_topk_ids_, PinnedBuffer<int32_t>::Create(t * k));
    ASSIGN_OR_RETURN(dispatch_copied_, Event::Create());
  }
  if (o.shared_expert_stream && ctx_.weights->shared_intermediate() > 0) {
    ASSIGN_OR_RETURN(shared_stream_, ForkedStream::Create());
  }
  return absl::OkStatus();
}

absl::Status FfnBlock::EnqueueMlp(const DeviceLinear& w_gate_up, const DeviceLinear& w_down,
                                  int inter, int num_tokens, const bf16* normed, float* out,
                                  cudaStream_t on) {
  const int h = ctx_.config.hidden_size;
  if (on == nullptr) on = ctx_.stream;
  RETURN_IF_ERROR(ctx_.Gemm(normed, h, w_gate_up, mlp_gu_.get(), 2 * inter, num_tokens, 2 * inter,
                            h, OutType::kBf16, false, on));
  SiluAndMulParams sp;
  sp.gate_up = mlp_gu_.get(), sp.out = mlp_act_.get(), sp.m = num_tokens, sp.i = inter,
  sp.stream = on;
  sp.limit = static_cast<float>(ctx_.config.swiglu_limit);
  RETURN_IF_ERROR(RunSiluAndMul(sp));
  return ctx_.Gemm(mlp_act_.get(), inter, w_down, out, h, num_tokens, h, inter, OutType::kFloat32,
                   true, on);
}

absl::Status FfnBlock::EnqueueMoe(int layer, int num_tokens, const bf16* normed,
                                  const float* normed_f32, float* out, ExpertClient* experts) {
  const ModelConfig& c = ctx_.config;
  const DeviceLayerWeights& w = ctx_.weights->layer(layer);
  cudaStream_t s = ctx_.stream;
  const int h = c.hidden_size, e = c.n_routed_experts, k = c.num_experts_per_tok,
            inter = c.moe_intermediate_size;
  // The shared experts on their own stream (CudaModelOptions::
  // shared_expert_stream): nothing on this stream until the join touches
  // `out`, mlp_gu_ / mlp_act_ or the FP8 GEMV's scratch (the routed experts
  // have their own). Joined on every return, errors included (an eager
  // caller must not find the side stream still writing `out`; a capture
  // must not end with it unjoined).
  const int shared_inter = ctx_.weights->shared_intermediate();
  const bool shared_aside = shared_stream_.created() && experts == nullptr &&
                            w.shared_gate_up.w != nullptr &&
                            ctx_.OnFp8Gemv(w.shared_gate_up, num_tokens, h) &&
                            ctx_.OnFp8Gemv(w.shared_down, num_tokens, shared_inter);
  struct JoinOnError {
    ForkedStream* side;  // null: joined (or never forked)
    cudaStream_t into;
    ~JoinOnError() {
      if (side != nullptr) side->Join(into).IgnoreError();
    }
  } join_on_error{shared_aside ? &shared_stream_ : nullptr, s};
  if (shared_aside) {
    RETURN_IF_ERROR(shared_stream_.Fork(s));
    RETURN_IF_ERROR(EnqueueMlp(w.shared_gate_up, w.shared_down, shared_inter, num_tokens, normed,
                               out, shared_stream_.get()));
  }
  // The router in fp32, as DeepSeek computes it: routing decisions are discrete.
  RETURN_IF_ERROR(
      ctx_.gemm->RunF32(normed_f32, w.router, router_logits_.get(), num_tokens, e, h, false, s));
  MoeGateParams gp;
  gp.logits = router_logits_.get(), gp.bias = w.router_bias;
  gp.num_tokens = num_tokens, gp.num_experts = e, gp.top_k = k, gp.n_group = c.n_group,
  gp.topk_group = c.topk_group;
  gp.scoring = c.scoring_func == ScoringFunc::kSoftmax        ? GateScoring::kSoftmax
               : c.scoring_func == ScoringFunc::kSqrtSoftplus ? GateScoring::kSqrtSoftplus
                                                              : GateScoring::kSigmoid;
  if (w.v4.tid2eid != nullptr) gp.forced_table = w.v4.tid2eid, gp.token_ids = ctx_.in->tokens;
  gp.select = SelectOf(c.topk_method);
  gp.renormalize = c.norm_topk_prob;
  gp.routed_scaling_factor = static_cast<float>(c.routed_scaling_factor);
  gp.topk_ids = topk_ids_.get(), gp.topk_weights = topk_w_.get(), gp.stream = s;
  RETURN_IF_ERROR(RunMoeGate(gp));
  if (ctx_.options.record_routing) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(
        routing_log_.get() + static_cast<size_t>(layer) * ctx_.max_tokens * k, topk_ids_.get(),
        static_cast<size_t>(num_tokens) * k * sizeof(int32_t), cudaMemcpyDeviceToDevice, s));
  }

  if (experts != nullptr) {
    return RunExternalExperts(layer, num_tokens, normed, normed_f32, out, experts);
  }
  const int rows = num_tokens * k;
  const int tile_m =
      ctx_.options.moe_tile_m > 0 ? ctx_.options.moe_tile_m : ExpertTileRows(rows, e);
  MoePermuteParams pp;
  pp.topk_ids = topk_ids_.get(), pp.num_tokens = num_tokens, pp.top_k = k, pp.num_experts = e,
  pp.tile_m = tile_m;
  pp.expert_offsets = expert_offsets_.get(), pp.tile_offsets = tile_offsets_.get();
  pp.row_token = row_token_.get(), pp.pair_row = pair_row_.get();
  pp.expert_counts = expert_counts_.get() + static_cast<size_t>(layer) * e, pp.stream = s;
  RETURN_IF_ERROR(RunMoePermute(pp));
  ExpertMlpParams mp;
  mp.x = normed, mp.ldx = h, mp.row_token = row_token_.get();
  mp.expert_offsets = expert_offsets_.get(), mp.tile_offsets = tile_offsets_.get(),
  mp.tile_m = tile_m;
  mp.rows = rows;
  SetExpertWeights(w.experts_gate_up, w.experts_down, &mp);
  mp.num_experts = e, mp.hidden = h, mp.inter = inter;
  mp.swiglu_limit = static_cast<float>(c.swiglu_limit);
  mp.gathered = moe_gathered_.get(), mp.gu = moe_gu_.get(), mp.act = moe_act_.get(),
  mp.y = moe_out_.get();
  mp.host_offsets = h_expert_offsets_.get(), mp.gemm = ctx_.gemm, mp.stream = s;
  if (mp.gate_up_fp8 != nullptr && moe_act_fp8_.get() != nullptr &&
      tile_m == kFp8ActivationTileRows) {
    mp.act_fp8 = moe_act_fp8_.get(), mp.act_fp8_scale = moe_act_fp8_scale_.get();
  }
  RETURN_IF_ERROR(EnqueueExpertMlp(mp));
  if (shared_aside) {
    join_on_error.side = nullptr;
    RETURN_IF_ERROR(shared_stream_.Join(s));
  } else if (w.shared_gate_up.w != nullptr) {
    RETURN_IF_ERROR(
        EnqueueMlp(w.shared_gate_up, w.shared_down, shared_inter, num_tokens, normed, out));
  }
  MoeCombineParams cp;
  cp.expert_out = moe_out_.get(), cp.pair_row = pair_row_.get(), cp.topk_weights = topk_w_.get();
  cp.num_tokens = num_tokens, cp.top_k = k, cp.hidden = h, cp.x = out, cp.stream = s;
  return RunMoeCombine(cp);
}

absl::Status FfnBlock::RunExternalExperts(int layer, int num_tokens, const bf16* normed,
                                          const float* normed_f32, float* out,
                                          ExpertClient* experts) {
  const ModelConfig& c = ctx_.config;
  const DeviceLayerWeights& w = ctx_.weights->layer(layer);
  cudaStream_t s = ctx_.stream;
  const size_t h = c.hidden_size, k = c.num_experts_per_tok, t = num_tokens;
  dispatch_input_ = normed;
  if (experts->memory_kinds().Takes(DispatchMemory::CudaDevice(ctx_.info.device))) {
    // Device-resident (cuda_ipc): the bf16 hidden states, ids and weights
    // stay in this GPU's memory; the experts' sum comes back into moe_out_.
    // (Captured piecewise: the dispatch happens between the segments.)
    if (ctx_.graphs->capturing()) {
      RETURN_IF_CUDA_ERROR(
          cudaEventRecordWithFlags(dispatch_copied_.get(), s, cudaEventRecordExternal));
    } else {
      RETURN_IF_ERROR(dispatch_copied_.Record(s));
    }
    if (w.shared_gate_up.w != nullptr) {  // runs while the experts work
      RETURN_IF_ERROR(EnqueueMlp(w.shared_gate_up, w.shared_down,
                                 ctx_.weights->shared_intermediate(), num_tokens, normed, out));
    }
    if (ctx_.graphs->capturing()) {
      RETURN_IF_ERROR(ctx_.graphs->CutSegment(layer));
    } else {
      // No host wait: the transport starts once the event fires and hands
      // the sum back on this stream.
      RETURN_IF_ERROR(RunDeviceDispatch(layer, dispatched_, normed, experts));
    }
    MoeCombineParams cp;  // x += routed (already weighted and summed over k)
    cp.expert_out = moe_out_.get(), cp.num_tokens = num_tokens, cp.top_k = 1,
    cp.hidden = c.hidden_size;
    cp.x = out, cp.stream = s;
    return RunMoeCombine(cp);
  }
  // The dispatch: the fp32 normalised hidden states (the CPU model's input to
  // its experts), the top-k ids and weights.
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(h_hidden_.get(), normed_f32, t * h * sizeof(float),
                                       cudaMemcpyDeviceToHost, s));
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(h_topk_ids_.get(), topk_ids_.get(), t * k * sizeof(int32_t),
                                       cudaMemcpyDeviceToHost, s));
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(h_topk_w_.get(), topk_w_.get(), t * k * sizeof(float),
                                       cudaMemcpyDeviceToHost, s));
  RETURN_IF_ERROR(dispatch_copied_.Record(s));
  // The shared expert runs on the device while the routed experts are away.
  if (w.shared_gate_up.w != nullptr) {
    RETURN_IF_ERROR(EnqueueMlp(w.shared_gate_up, w.shared_down, ctx_.weights->shared_intermediate(),
                               num_tokens, normed, out));
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
  cp.x = out, cp.stream = s;
  RETURN_IF_ERROR(RunMoeCombine(cp));
  // The host buffers are reused by the next layer: wait for the upload.
  return CudaStatus(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

absl::Status FfnBlock::LaunchDeviceDispatch(int layer, int num_tokens, ExpertClient* experts) {
  // Starts once the event recorded inside the segment fires.
  return RunDeviceDispatch(layer, num_tokens, dispatch_input_, experts);
}

absl::Status FfnBlock::RunDeviceDispatch(int layer, int num_tokens, const bf16* normed,
                                         ExpertClient* experts) {
  const ModelConfig& c = ctx_.config;
  MoeDispatch d;
  d.layer = layer, d.num_tokens = num_tokens;
  d.hidden = c.hidden_size, d.top_k = c.num_experts_per_tok;
  d.memory = DispatchMemory::CudaDevice(ctx_.info.device);
  d.hidden_states = normed;
  d.topk_ids = topk_ids_.get(), d.topk_weights = topk_w_.get();
  d.ready = dispatch_copied_.get(), d.stream = ctx_.stream;
  return experts->Run(d, moe_out_.get());
}

absl::StatusOr<std::vector<int32_t>> FfnBlock::ExpertCounts() {
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(ctx_.stream));
  return expert_counts_.ToHost();
}

absl::StatusOr<std::vector<int32_t>> FfnBlock::Routing(int* rows) {
  const ModelConfig& c = ctx_.config;
  if (!ctx_.options.record_routing) {
    return absl::FailedPreconditionError("CudaModel: record_routing is off");
  }
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(ctx_.stream));
  ASSIGN_OR_RETURN(std::vector<int32_t> all, routing_log_.ToHost());
  const int k = std::max(c.num_experts_per_tok, 1);
  std::vector<int32_t> out;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const auto begin = all.begin() + static_cast<size_t>(l) * ctx_.max_tokens * k;
    if (ctx_.weights->layer(l).is_moe) {
      out.insert(out.end(), begin, begin + static_cast<size_t>(pass_tokens_) * k);
    } else {
      out.insert(out.end(), static_cast<size_t>(pass_tokens_) * k, -1);
    }
  }
  *rows = pass_tokens_;
  return out;
}

}  // namespace moesh::cuda
