#include "common/model/expert_client.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "kernels/cpu/ops.h"

namespace moesh {

ExpertStage::ExpertStage(const ModelConfig& config, std::unique_ptr<ExpertShardWeights> weights)
    : config_(config) {
  // Placeholders (dummy weights) are for devices that make their own.
  shards_.push_back(std::move(weights));
}

absl::Status ExpertStage::AddShard(std::unique_ptr<ExpertShardWeights> more) {
  absl::MutexLock lock(&mu_);
  shards_.push_back(std::move(more));
  return absl::OkStatus();
}

absl::StatusOr<ExpertStage::Shards> ExpertStage::ShardsWithout(const std::set<int>& ids) const {
  Shards out;
  size_t left = 0;
  for (const auto& s : shards()) {
    bool touched = false;
    for (int e : ids) touched = touched || s->expert_ids.count(e) > 0;
    if (!touched) {
      out.push_back(s);
      left += s->expert_ids.size();
      continue;
    }
    auto copy = std::make_shared<ExpertShardWeights>();
    copy->deferred = s->deferred;
    for (int e : s->expert_ids) {
      if (!ids.count(e)) copy->expert_ids.insert(e);
    }
    if (copy->expert_ids.empty()) continue;
    for (const auto& [layer, experts] : s->layers) {
      for (const auto& [e, w] : experts) {
        if (copy->expert_ids.count(e)) copy->layers[layer][e] = w;
      }
    }
    left += copy->expert_ids.size();
    out.push_back(std::move(copy));
  }
  if (left == 0)
    return absl::InvalidArgumentError("removing those experts would leave this stage none");
  return out;
}

void ExpertStage::SetShards(Shards shards) {
  absl::MutexLock lock(&mu_);
  shards_ = std::move(shards);  // running dispatches hold the shards they started with
}

absl::Status ExpertStage::RemoveExperts(const std::set<int>& ids) {
  ASSIGN_OR_RETURN(Shards kept, ShardsWithout(ids));
  SetShards(std::move(kept));
  return absl::OkStatus();
}

ExpertStage::Shards ExpertStage::shards() const {
  absl::MutexLock lock(&mu_);
  return shards_;
}

std::set<int> ExpertStage::expert_ids() const {
  std::set<int> ids;
  for (const auto& s : shards()) ids.insert(s->expert_ids.begin(), s->expert_ids.end());
  return ids;
}

std::vector<int> ExpertStage::moe_layers() const {
  std::vector<int> layers;
  for (const auto& [l, experts] : shards().front()->layers) layers.push_back(l);
  return layers;
}

bool ExpertStage::IsMoeLayer(int layer) const { return shards().front()->layers.count(layer) > 0; }

absl::Status ExpertStage::Accumulate(const MoeDispatch& d, float* out,
                                     std::vector<CountedDispatch>*) const {
  if (!memory_kinds().Takes(d.memory)) {  // the message is built only then
    return CheckDispatchMemory(d, memory_kinds(), absl::StrCat("the expert stage on ", device()));
  }
  const Shards shards = this->shards();
  if (!shards.front()->layers.count(d.layer)) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", d.layer, " is not an MoE layer"));
  }
  // The first shard holding each expert serves it.
  auto find = [&](int e) -> const MlpWeights* {
    for (const auto& s : shards) {
      if (!s->expert_ids.count(e)) continue;
      return &s->layers.at(d.layer).at(e);
    }
    return nullptr;
  };
  if (d.hidden != config_.hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat("dispatch hidden size ", d.hidden,
                                                   " != model hidden size ", config_.hidden_size));
  }
  // Group the (token, slot) pairs by expert so each expert runs one GEMM.
  std::map<int, std::vector<std::pair<int, float>>> by_expert;
  for (int t = 0; t < d.num_tokens; ++t) {
    for (int k = 0; k < d.top_k; ++k) {
      const int e = d.topk_ids[t * d.top_k + k];
      if (e < 0) continue;  // a pair routed elsewhere
      if (e >= config_.n_routed_experts) {
        return absl::InvalidArgumentError(absl::StrCat("expert id ", e, " out of range"));
      }
      if (find(e) == nullptr) continue;
      by_expert[e].emplace_back(t, d.topk_weights[t * d.top_k + k]);
    }
  }
  const int h = d.hidden;
  const int inter = config_.moe_intermediate_size;
  std::vector<float> x, gate_up, act, y;
  for (const auto& [e, items] : by_expert) {
    const MlpWeights& w = *find(e);
    if (w.gate_up.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("expert ", e,
                       " has placeholder weights (--load_format dummy) "
                       "and the CPU computes from real ones only"));
    }
    const int m = static_cast<int>(items.size());
    x.resize(static_cast<size_t>(m) * h);
    for (int i = 0; i < m; ++i) {
      std::memcpy(&x[static_cast<size_t>(i) * h],
                  d.hidden_f32() + static_cast<size_t>(items[i].first) * h, h * sizeof(float));
    }
    gate_up.resize(static_cast<size_t>(m) * 2 * inter);
    act.resize(static_cast<size_t>(m) * inter);
    y.resize(static_cast<size_t>(m) * h);
    cpu::Linear(x.data(), w.gate_up.data(), gate_up.data(), m, 2 * inter, h);
    cpu::SiluAndMul(gate_up.data(), act.data(), m, inter, static_cast<float>(config_.swiglu_limit));
    cpu::Linear(act.data(), w.down.data(), y.data(), m, h, inter);
    for (int i = 0; i < m; ++i) {
      cpu::Axpy(items[i].second, &y[static_cast<size_t>(i) * h],
                out + static_cast<size_t>(items[i].first) * h, h);
    }
  }
  return absl::OkStatus();
}

namespace {
class DonePending : public PendingDispatch {
 public:
  explicit DonePending(absl::Status s) : status_(std::move(s)) {}
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};
}  // namespace

std::unique_ptr<PendingDispatch> ExpertClient::Start(const MoeDispatch& dispatch, float* out) {
  return std::make_unique<DonePending>(Run(dispatch, out));
}

absl::Status LocalExpertClient::Run(const MoeDispatch& d, float* out) {
  RETURN_IF_ERROR(CheckDispatchMemory(d, memory_kinds(), "the local expert client"));
  std::fill(out, out + static_cast<size_t>(d.num_tokens) * d.hidden, 0.0f);
  return stage_->Accumulate(d, out);
}

}  // namespace moesh
