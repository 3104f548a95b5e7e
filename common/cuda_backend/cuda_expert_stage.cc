#include "common/cuda_backend/cuda_expert_stage.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/dtype.h"
#include "common/cuda_backend/device_weights.h"
#include "kernels/cuda/expert_mlp.h"
#include "kernels/cuda/model_ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/stream_flag.h"

namespace moesh::cuda {
namespace {

template <typename T>
absl::Status Grow(DeviceBuffer<T>* b, size_t n) {
  if (b->size() >= n && n > 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(*b, DeviceBuffer<T>::Create(std::max<size_t>(n, 1)));
  return absl::OkStatus();
}

template <typename T>
absl::Status GrowPinned(PinnedBuffer<T>* b, size_t n) {
  if (b->size() >= n && n > 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(*b, PinnedBuffer<T>::Create(std::max<size_t>(n, 1)));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaExpertStage>> CudaExpertStage::Create(
    const ModelConfig& config, std::unique_ptr<ExpertShardWeights> weights, bool fp8) {
  if (config.n_routed_experts < 1 || config.n_routed_experts > 1024) {
    return absl::UnimplementedError("CudaExpertStage: needs 1..1024 routed experts");
  }
  if (config.hidden_size % 32 != 0 || config.moe_intermediate_size % 32 != 0) {
    return absl::UnimplementedError(absl::StrCat(
        "CudaExpertStage: the grouped GEMM needs hidden_size (", config.hidden_size,
        ") and moe_intermediate_size (", config.moe_intermediate_size, ") divisible by 32"));
  }
  ASSIGN_OR_RETURN(DeviceInfo info, CurrentDeviceInfo());
  ASSIGN_OR_RETURN(Stream stream, Stream::Create());
  const ExpertShardWeights* first = weights.get();
  std::unique_ptr<CudaExpertStage> stage(
      new CudaExpertStage(config, std::move(weights), std::move(stream), info.device, fp8));
  stage->hosted_.push_back(first);
  ASSIGN_OR_RETURN(std::shared_ptr<const Stacks> stacks, stage->Build(stage->hosted_, nullptr));
  absl::MutexLock lock(&stage->stacks_mu_);
  stage->stacks_ = std::move(stacks);
  return stage;
}

CudaExpertStage::~CudaExpertStage() {
  if (stream_.get() != nullptr) cudaStreamSynchronize(stream_.get());
  absl::MutexLock lock(&lanes_mu_);
  for (const std::unique_ptr<Lane>& lane : lanes_) {
    if (lane != nullptr) cudaStreamSynchronize(lane->stream.get());
  }
}

absl::StatusOr<CudaExpertStage::Lane*> CudaExpertStage::LaneFor(int lane) const {
  absl::MutexLock lock(&lanes_mu_);
  std::unique_ptr<Lane>& l = lanes_[static_cast<unsigned>(lane) % kMaxLanes];
  if (l == nullptr) {
    auto made = std::make_unique<Lane>();
    ASSIGN_OR_RETURN(made->stream, Stream::Create());
    l = std::move(made);
  }
  return l.get();
}

std::shared_ptr<const CudaExpertStage::Stacks> CudaExpertStage::current_stacks() const {
  absl::MutexLock lock(&stacks_mu_);
  return stacks_;
}

size_t CudaExpertStage::device_bytes() const {
  absl::MutexLock lock(&stacks_mu_);
  return stacks_->bytes;
}

absl::StatusOr<std::shared_ptr<const CudaExpertStage::Stacks>> CudaExpertStage::Build(
    const std::vector<const ExpertShardWeights*>& shards, const Stacks* old) const {
  const ModelConfig& c = config();
  const size_t h = c.hidden_size, inter = c.moe_intermediate_size;
  auto stacks = std::make_shared<Stacks>();
  stacks->local.assign(c.n_routed_experts, -1);
  std::vector<std::pair<int, const ExpertShardWeights*>> order;  // (global id, shard serving it)
  for (const ExpertShardWeights* s : shards) {
    for (int e : s->expert_ids) {
      if (e < 0 || e >= c.n_routed_experts) {
        return absl::InvalidArgumentError(
            absl::StrCat("CudaExpertStage: expert id ", e, " out of range"));
      }
      if (stacks->local[e] >= 0) continue;
      stacks->local[e] = static_cast<int32_t>(order.size());
      order.emplace_back(e, s);
    }
  }
  stacks->num_local = static_cast<int>(order.size());
  if (order.empty())
    return absl::InvalidArgumentError("CudaExpertStage: the shard hosts no experts");
  auto reused = [old](int e) { return old != nullptr && old->local[e] >= 0; };
  {  // Progress: the bytes of the experts read from checkpoints.
    std::map<const Checkpoint*, std::set<int>> reads;
    for (const auto& [e, shard] : order) {
      if (shard->deferred != nullptr && !reused(e)) reads[shard->deferred].insert(e);
    }
    for (const auto& [ckpt, ids] : reads) ckpt->PlanRead(ExpertLoadBytes(c, *ckpt, ids));
  }
  std::vector<uint16_t> staging;
  const float fan_h = static_cast<float>(1.0 / std::sqrt(static_cast<double>(h)));
  const float fan_i = static_cast<float>(1.0 / std::sqrt(static_cast<double>(inter)));
  DeviceBuffer<float> f32_scratch;
  DeviceBuffer<bf16> bf16_scratch;
  const size_t n_local = order.size();
  for (const auto& [layer, unused] : shards.front()->layers) {
    ExpertLayer& ls = stacks->layers[layer];
    ASSIGN_OR_RETURN(ls.gate_up_bytes, DeviceBuffer<uint8_t>::Create(
                                           n_local * LinearWeightBytes(format_, 2 * inter, h)));
    ASSIGN_OR_RETURN(ls.down_bytes,
                     DeviceBuffer<uint8_t>::Create(n_local * LinearWeightBytes(format_, h, inter)));
    ls.gate_up.w = ls.gate_up_bytes.get(), ls.down.w = ls.down_bytes.get();
    if (format_ != LinearFormat::kBf16) {
      ASSIGN_OR_RETURN(ls.gate_up_scales, DeviceBuffer<uint8_t>::Create(
                                              n_local * LinearScaleBytes(format_, 2 * inter, h)));
      ASSIGN_OR_RETURN(ls.down_scales, DeviceBuffer<uint8_t>::Create(
                                           n_local * LinearScaleBytes(format_, h, inter)));
    }
    if (format_ == LinearFormat::kFp8) {
      ls.gate_up.scale = reinterpret_cast<float*>(ls.gate_up_scales.get());
      ls.down.scale = reinterpret_cast<float*>(ls.down_scales.get());
    }
    if (format_ == LinearFormat::kMxfp4) {
      ls.gate_up.mx_scale = ls.gate_up_scales.get(), ls.down.mx_scale = ls.down_scales.get();
    }
    stacks->bytes += ls.gate_up_bytes.bytes() + ls.down_bytes.bytes() + ls.gate_up_scales.bytes() +
                     ls.down_scales.bytes();
    for (size_t i = 0; i < order.size(); ++i) {
      const auto& [e, shard] = order[i];
      auto lit = shard->layers.find(layer);
      if (lit == shard->layers.end() || !lit->second.count(e)) {
        return absl::InvalidArgumentError(
            absl::StrCat("CudaExpertStage: layer ", layer, " lacks expert ", e));
      }
      const DeviceLinear gate_up = LinearSlice(ls.gate_up, i, 2 * inter, h),
                         down = LinearSlice(ls.down, i, h, inter);
      if (reused(e) && old->layers.count(layer)) {  // already on this device: copied there
        const ExpertLayer& from = old->layers.at(layer);
        const int64_t j = old->local[e];
        RETURN_IF_ERROR(CopyLinear(gate_up, LinearSlice(from.gate_up, j, 2 * inter, h), 2 * inter,
                                   h, stream_.get()));
        RETURN_IF_ERROR(
            CopyLinear(down, LinearSlice(from.down, j, h, inter), h, inter, stream_.get()));
        continue;
      }
      if (shard->deferred != nullptr) {  // read from the checkpoint as stored
        ASSIGN_OR_RETURN(StoredMlp m, ReadStoredExpert(c, *shard->deferred, layer, e));
        RETURN_IF_ERROR(
            UploadStoredMlp(*shard->deferred, &m, gate_up, down, h, &staging, &f32_scratch));
        continue;
      }
      const MlpWeights& w = lit->second.at(e);
      if (shard->is_placeholder()) {  // --load_format dummy: random on the device, seeded by
                                      // (layer, expert)
        const uint64_t seed =
            (static_cast<uint64_t>(layer) << 20) ^ static_cast<uint64_t>(e) ^ 0x9e3779b97f4a7c15ull;
        RETURN_IF_ERROR(
            FillLinear(gate_up, 2 * inter, h, seed, fan_h, stream_.get(), &bf16_scratch));
        RETURN_IF_ERROR(FillLinear(down, h, inter, seed + 1, fan_i, stream_.get(), &bf16_scratch));
        continue;
      }
      if (w.gate_up.size() != 2 * inter * h || w.down.size() != h * inter) {
        return absl::InvalidArgumentError(
            absl::StrCat("CudaExpertStage: layer ", layer, " expert ", e, " has the wrong shape"));
      }
      RETURN_IF_ERROR(
          UploadLinear(gate_up, w.gate_up.data(), 2 * inter, h, &staging, &f32_scratch));
      RETURN_IF_ERROR(UploadLinear(down, w.down.data(), h, inter, &staging, &f32_scratch));
    }
  }
  RETURN_IF_ERROR(stream_.Synchronize());
  return std::shared_ptr<const Stacks>(std::move(stacks));
}

absl::Status CudaExpertStage::AddShard(std::unique_ptr<ExpertShardWeights> more) {
  absl::MutexLock add_lock(&add_mu_);
  RETURN_IF_CUDA_ERROR(cudaSetDevice(ordinal_));
  std::vector<const ExpertShardWeights*> all = hosted_;
  all.push_back(more.get());
  ASSIGN_OR_RETURN(std::shared_ptr<const Stacks> stacks, Build(all, current_stacks().get()));
  const ExpertShardWeights* added = more.get();
  RETURN_IF_ERROR(ExpertStage::AddShard(std::move(more)));
  hosted_.push_back(added);
  absl::MutexLock lock(&stacks_mu_);
  stacks_ = std::move(stacks);  // a running dispatch keeps the old stacks alive
  return absl::OkStatus();
}

absl::Status CudaExpertStage::RemoveExperts(const std::set<int>& ids) {
  absl::MutexLock add_lock(&add_mu_);
  RETURN_IF_CUDA_ERROR(cudaSetDevice(ordinal_));
  ASSIGN_OR_RETURN(Shards kept, ShardsWithout(ids));
  std::vector<const ExpertShardWeights*> hosted;
  for (const auto& s : kept) hosted.push_back(s.get());
  ASSIGN_OR_RETURN(std::shared_ptr<const Stacks> stacks, Build(hosted, current_stacks().get()));
  SetShards(std::move(kept));
  hosted_ = std::move(hosted);
  absl::MutexLock lock(&stacks_mu_);
  stacks_ = std::move(stacks);
  return absl::OkStatus();
}

absl::Status CudaExpertStage::EnsureScratch(Lane& lane, int num_tokens, int top_k,
                                            int num_local) const {
  if (num_tokens <= lane.scratch_tokens && top_k <= lane.scratch_top_k &&
      num_local <= lane.scratch_local) {
    return absl::OkStatus();
  }
  const ModelConfig& c = config();
  // Rows for the most tokens and the widest top-k seen (a dispatch's top_k is the sender's).
  const size_t t = std::max(num_tokens, lane.scratch_tokens),
               rows = t * std::max(top_k, lane.scratch_top_k);
  const size_t h = c.hidden_size, inter = c.moe_intermediate_size;
  const size_t e = std::max(num_local, lane.scratch_local);
  Scratch& s = lane.scratch;
  lane.uploaded_map.clear();  // s.map may move
  RETURN_IF_ERROR(Grow(&s.x, t * h));
  // kDenseRowAlign rows of slack: the per-expert dense GEMMs' last spill (expert_mlp.h).
  RETURN_IF_ERROR(Grow(&s.gu, (rows + kDenseRowAlign) * 2 * inter));
  RETURN_IF_ERROR(Grow(&s.act, (rows + kDenseRowAlign) * inter));
  RETURN_IF_ERROR(Grow(&s.y, (rows + kDenseRowAlign) * h));
  if (rows >= static_cast<size_t>(kDenseRowsPerExpert) * e) {
    RETURN_IF_ERROR(Grow(&s.gathered, (rows + kDenseRowAlign) * h));
    RETURN_IF_ERROR(GrowPinned(&s.h_offsets, e + 1));
    if (s.gemm == nullptr) {
      ASSIGN_OR_RETURN(s.gemm, CublasGemm::Create());
    }
  }
  if (fp8_activations()) {
    const int pairs = static_cast<int>(rows);
    RETURN_IF_ERROR(
        Grow(&s.act_fp8, Fp8ActivationCodes(pairs, c.hidden_size, c.moe_intermediate_size)));
    RETURN_IF_ERROR(
        Grow(&s.act_fp8_scale, Fp8ActivationScales(pairs, c.hidden_size, c.moe_intermediate_size)));
  }
  RETURN_IF_ERROR(Grow(&s.out, t * h));
  RETURN_IF_ERROR(Grow(&s.weights, rows));
  RETURN_IF_ERROR(Grow(&s.ids, rows));
  RETURN_IF_ERROR(Grow(&s.row_token, rows));
  RETURN_IF_ERROR(Grow(&s.pair_row, rows));
  RETURN_IF_ERROR(Grow(&s.expert_offsets, e + 1));
  RETURN_IF_ERROR(Grow(&s.tile_offsets, e + 1));
  RETURN_IF_ERROR(GrowPinned(&s.h_x, t * h));
  RETURN_IF_ERROR(GrowPinned(&s.h_out, t * h));
  RETURN_IF_ERROR(GrowPinned(&s.h_w, rows));
  RETURN_IF_ERROR(GrowPinned(&s.h_ids, rows));
  RETURN_IF_ERROR(Grow(&s.map, c.n_routed_experts));
  RETURN_IF_ERROR(GrowPinned(&s.h_map, c.n_routed_experts));
  lane.scratch_tokens = static_cast<int>(t);
  lane.scratch_top_k = std::max(top_k, lane.scratch_top_k);
  lane.scratch_local = static_cast<int>(e);
  return absl::OkStatus();
}

std::shared_ptr<const CudaExpertStage::Stacks> CudaExpertStage::Snapshot() const {
  absl::MutexLock lock(&stacks_mu_);
  return stacks_;
}

absl::Status CudaExpertStage::EnqueueExperts(Lane& lane, const ExpertLayer& ls, int num_local,
                                             const ExpertPass& p) const {
  const ModelConfig& c = config();
  const int h = c.hidden_size, inter = c.moe_intermediate_size, e = num_local;
  Scratch& s = lane.scratch;
  cudaStream_t st = lane.stream.get();
  const int tile_m = ExpertTileRows(p.expected_rows, p.served);
  MoePermuteParams pp;
  pp.topk_ids = p.ids, pp.num_tokens = p.num_tokens, pp.top_k = p.top_k, pp.num_experts = e,
  pp.tile_m = tile_m;
  pp.expert_map = p.map, pp.map_size = p.map_size;
  pp.expert_offsets = s.expert_offsets.get(), pp.tile_offsets = s.tile_offsets.get();
  pp.row_token = s.row_token.get(), pp.pair_row = s.pair_row.get(), pp.stream = st;
  RETURN_IF_ERROR(RunMoePermute(pp));
  ExpertMlpParams mp;
  mp.x = p.x, mp.ldx = h, mp.row_token = s.row_token.get();
  mp.expert_offsets = s.expert_offsets.get(), mp.tile_offsets = s.tile_offsets.get(),
  mp.tile_m = tile_m;
  mp.rows = p.max_rows, mp.expected_rows = p.expected_rows, mp.active_experts = p.served;
  SetExpertWeights(ls.gate_up, ls.down, &mp);
  mp.num_experts = e, mp.hidden = h, mp.inter = inter;
  mp.swiglu_limit = static_cast<float>(config().swiglu_limit);
  mp.gathered = s.gathered.get(), mp.gu = s.gu.get(), mp.act = s.act.get(), mp.y = s.y.get();
  mp.host_offsets = s.h_offsets.get(), mp.gemm = s.gemm.get(), mp.stream = st;
  if (fp8_activations() && tile_m == kFp8ActivationTileRows) {
    mp.act_fp8 = s.act_fp8.get(), mp.act_fp8_scale = s.act_fp8_scale.get();
  }
  RETURN_IF_ERROR(EnqueueExpertMlp(mp));
  MoeCombineParams cp;
  cp.expert_out = s.y.get(), cp.pair_row = s.pair_row.get(), cp.topk_weights = p.weights;
  cp.num_tokens = p.num_tokens, cp.top_k = p.top_k, cp.hidden = h, cp.x = p.out, cp.stream = st;
  cp.overwrite = true;  // every row written: no zeroing launch before it
  return RunMoeCombine(cp);
}

absl::Status CudaExpertStage::Accumulate(const MoeDispatch& d, float* out,
                                         std::vector<CountedDispatch>* counted) const {
  if (!memory_kinds().Takes(d.memory)) {  // the message is built only then
    return CheckDispatchMemory(d, memory_kinds(), absl::StrCat("the expert stage on ", device_));
  }
  return d.memory.is_host() ? AccumulateHost(d, out) : AccumulateDevice(d, out, counted);
}

absl::Status CudaExpertStage::AccumulateHost(const MoeDispatch& d, float* out) const {
  const ModelConfig& c = config();
  if (!IsMoeLayer(d.layer))
    return absl::InvalidArgumentError(absl::StrCat("layer ", d.layer, " is not an MoE layer"));
  if (d.hidden != c.hidden_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("dispatch hidden size ", d.hidden, " != model hidden size ", c.hidden_size));
  }
  if (d.num_tokens == 0) return absl::OkStatus();
  const std::shared_ptr<const Stacks> stacks = Snapshot();
  const ExpertLayer& ls = stacks->layers.at(d.layer);
  const int t = d.num_tokens, k = d.top_k, h = c.hidden_size;
  const int rows = t * k, e = stacks->num_local;

  ASSIGN_OR_RETURN(Lane * lane, LaneFor(d.lane));
  absl::MutexLock lock(&lane->mu);
  RETURN_IF_CUDA_ERROR(cudaSetDevice(ordinal_));
  // A device dispatch still running reads host buffers.
  RETURN_IF_ERROR(DrainPending(*lane, nullptr));
  RETURN_IF_ERROR(EnsureScratch(*lane, t, k, e));
  Scratch& s = lane->scratch;
  // Host staging: hidden states to bf16, expert ids to this stage's rows.
  int hosted_pairs = 0;
  for (int i = 0; i < rows; ++i) {
    const int id = d.topk_ids[i];
    if (id >= c.n_routed_experts)
      return absl::InvalidArgumentError(absl::StrCat("expert id ", id, " out of range"));
    s.h_ids.get()[i] = id < 0 ? -1 : stacks->local[id];
    s.h_w.get()[i] = d.topk_weights[i];
    hosted_pairs += s.h_ids.get()[i] >= 0;
  }
  if (hosted_pairs == 0) return absl::OkStatus();
  for (size_t i = 0; i < static_cast<size_t>(t) * h; ++i)
    s.h_x.get()[i] = F32ToBf16(d.hidden_f32()[i]);
  cudaStream_t st = lane->stream.get();
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(s.x.get(), s.h_x.get(), static_cast<size_t>(t) * h * 2,
                                       cudaMemcpyHostToDevice, st));
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(s.ids.get(), s.h_ids.get(), rows * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, st));
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(s.weights.get(), s.h_w.get(), rows * sizeof(float),
                                       cudaMemcpyHostToDevice, st));

  ExpertPass pass;
  pass.x = s.x.get(), pass.ids = s.ids.get(), pass.weights = s.weights.get(),
  pass.out = s.out.get();
  pass.num_tokens = t, pass.top_k = k, pass.max_rows = hosted_pairs,
  pass.expected_rows = hosted_pairs;
  pass.served = e;
  RETURN_IF_ERROR(EnqueueExperts(*lane, ls, e, pass));
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(s.h_out.get(), s.out.get(),
                                       static_cast<size_t>(t) * h * sizeof(float),
                                       cudaMemcpyDeviceToHost, st));
  RETURN_IF_ERROR(lane->stream.Synchronize());
  for (size_t i = 0; i < static_cast<size_t>(t) * h; ++i) out[i] += s.h_out.get()[i];
  return absl::OkStatus();
}

absl::Status CudaExpertStage::DrainPending(Lane& lane,
                                           std::vector<CountedDispatch>* counted) const {
  if (!lane.pending) return absl::OkStatus();
  RETURN_IF_CUDA_ERROR(cudaEventSynchronize(lane.pending_event.get()));
  lane.pending = false;
  if (counted == nullptr) return absl::OkStatus();  // a caller that does not count: dropped
  CountedDispatch c = std::move(lane.pending_counted);
  const size_t rows = static_cast<size_t>(c.num_tokens) * c.top_k;
  if (lane.pending_ids.get() != nullptr && rows > 0) {
    c.ids.assign(lane.pending_ids.get(), lane.pending_ids.get() + rows);
    CountOnlyServed(lane.pending_serve, &c.ids);
  }
  counted->push_back(std::move(c));
  return absl::OkStatus();
}

void CudaExpertStage::CountOnlyServed(const std::vector<uint8_t>& serve,
                                      std::vector<int32_t>* ids) const {
  if (serve.empty()) return;
  for (int32_t& id : *ids) {
    if (id >= 0 && (id >= static_cast<int32_t>(serve.size()) || serve[id] == 0)) id = -1;
  }
}

absl::Status CudaExpertStage::AccumulateDevice(const MoeDispatch& d, float* out,
                                               std::vector<CountedDispatch>* counted) const {
  const ModelConfig& c = config();
  if (!IsMoeLayer(d.layer))
    return absl::InvalidArgumentError(absl::StrCat("layer ", d.layer, " is not an MoE layer"));
  if (d.hidden != c.hidden_size || d.top_k < 1 || d.num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("device dispatch of ", d.num_tokens, " x ",
                                                   d.hidden, " top-", d.top_k,
                                                   " for a model of hidden size ", c.hidden_size));
  }
  if (d.serve != nullptr && d.num_experts != c.n_routed_experts) {
    return absl::InvalidArgumentError(absl::StrCat("a serve mask of ", d.num_experts,
                                                   " experts for a model of ", c.n_routed_experts));
  }
  if (d.num_tokens > 0 &&
      (d.hidden_states == nullptr || d.topk_ids == nullptr || d.topk_weights == nullptr)) {
    return absl::InvalidArgumentError("device dispatch: null buffer");
  }
  const std::shared_ptr<const Stacks> stacks = Snapshot();
  const ExpertLayer& ls = stacks->layers.at(d.layer);
  const int t = d.num_tokens, k = d.top_k, h = c.hidden_size;
  const int rows = t * k, e = stacks->num_local;

  ASSIGN_OR_RETURN(Lane * lane, LaneFor(d.lane));
  absl::MutexLock lock(&lane->mu);
  RETURN_IF_CUDA_ERROR(cudaSetDevice(ordinal_));
  // The lane's earlier dispatch that did not wait is done before the host
  // buffers it used are written again (it almost always is by now).
  RETURN_IF_ERROR(DrainPending(*lane, counted));
  RETURN_IF_ERROR(EnsureScratch(*lane, std::max(t, 1), k, e));
  Scratch& s = lane->scratch;
  cudaStream_t st = lane->stream.get();
  const bool wait = d.done == nullptr && d.done_flag == nullptr;
  if (!wait && d.ready_flag != nullptr) {
    RETURN_IF_ERROR(cuda::StreamWaitFlag(st, d.ready_flag, d.sync_value));
  } else if (!wait && d.ready != nullptr) {
    RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(st, static_cast<cudaEvent_t>(d.ready), 0));
  }
  // Global expert id -> row in the stacks, for the experts served here.
  int served = 0;
  for (int g = 0; g < c.n_routed_experts; ++g) {
    if (d.serve != nullptr && d.serve[g] != 0 && stacks->local[g] < 0) {
      // Never skip an expert asked for: its pairs would go missing.
      return absl::FailedPreconditionError(absl::StrCat(
          "expert ", g, " is not hosted here (the placement moved; route by the new map)"));
    }
    const bool serve = stacks->local[g] >= 0 && (d.serve == nullptr || d.serve[g] != 0);
    s.h_map.get()[g] = serve ? stacks->local[g] : -1;
    served += serve;
  }
  // Returning early, the ids come back beside the experts' kernels.
  const bool ids_aside = !wait && counted != nullptr && rows > 0;
  if (ids_aside) {
    if (!lane->ids_stream.created()) {
      ASSIGN_OR_RETURN(lane->ids_stream, ForkedStream::Create());
    }
    if (lane->pending_ids.size() < static_cast<size_t>(rows)) {
      ASSIGN_OR_RETURN(lane->pending_ids, PinnedBuffer<int32_t>::Create(std::max<size_t>(
                                              rows, 2 * lane->pending_ids.size())));
    }
    RETURN_IF_ERROR(lane->ids_stream.Fork(st));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(lane->pending_ids.get(), d.topk_ids,
                                         rows * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                         lane->ids_stream.get()));
  }
  if (t > 0 && served == 0) {  // no pass to write the rows
    RETURN_IF_CUDA_ERROR(cudaMemsetAsync(out, 0, static_cast<size_t>(t) * h * sizeof(float), st));
  }
  if (t > 0 && served > 0) {
    const int32_t* map = s.h_map.get();
    if (!std::equal(lane->uploaded_map.begin(), lane->uploaded_map.end(), map,
                    map + c.n_routed_experts)) {
      RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(s.map.get(), map, c.n_routed_experts * sizeof(int32_t),
                                           cudaMemcpyHostToDevice, st));
      lane->uploaded_map.assign(map, map + c.n_routed_experts);
    }
    // The pairs that land here are known only on the device: size by the
    // expected share (balanced routing) and bound the launches by all pairs.
    ExpertPass pass;
    pass.x = reinterpret_cast<const bf16*>(d.hidden_bf16()), pass.ids = d.topk_ids,
    pass.weights = d.topk_weights;
    pass.map = s.map.get(), pass.map_size = c.n_routed_experts, pass.out = out;
    pass.num_tokens = t, pass.top_k = k, pass.max_rows = rows, pass.served = served;
    pass.expected_rows =
        std::max(1, static_cast<int>(static_cast<int64_t>(rows) * served / c.n_routed_experts));
    RETURN_IF_ERROR(EnqueueExperts(*lane, ls, e, pass));
  }
  CountedDispatch mine;
  mine.layer = d.layer, mine.num_tokens = t, mine.top_k = k;
  std::vector<uint8_t> serve_mask;
  if (d.serve != nullptr) serve_mask.assign(d.serve, d.serve + d.num_experts);
  if (!wait) {  // enqueued: the ids come back with the work, counted by a later call
    // The caller may rewrite its ids once `done` fires: their copy is done by then.
    if (ids_aside) RETURN_IF_ERROR(lane->ids_stream.Join(st));
    if (lane->pending_event.get() == nullptr) {
      ASSIGN_OR_RETURN(lane->pending_event, Event::Create());
    }
    RETURN_IF_ERROR(lane->pending_event.Record(st));
    if (d.done_flag != nullptr) {
      RETURN_IF_ERROR(cuda::StreamWriteFlag(st, d.done_flag, d.sync_value));
    } else {
      RETURN_IF_CUDA_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(d.done), st));
    }
    lane->pending = true;
    lane->pending_counted = std::move(mine);
    if (counted == nullptr || rows == 0) lane->pending_counted.num_tokens = 0;  // nothing to count
    lane->pending_serve = std::move(serve_mask);
    return absl::OkStatus();
  }
  if (counted != nullptr && rows > 0) {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(s.h_ids.get(), d.topk_ids, rows * sizeof(int32_t),
                                         cudaMemcpyDeviceToHost, st));
  }
  RETURN_IF_ERROR(lane->stream.Synchronize());
  if (counted != nullptr) {
    if (rows > 0) {
      mine.ids.assign(s.h_ids.get(), s.h_ids.get() + rows);
      CountOnlyServed(serve_mask, &mine.ids);
    }
    counted->push_back(std::move(mine));
  }
  return absl::OkStatus();
}

}  // namespace moesh::cuda
