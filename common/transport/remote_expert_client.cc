#include "common/transport/remote_expert_client.h"

#include <cstring>
#include <iostream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "base/status.h"
#include "common/transport/dispatch_wire.h"
#include "kernels/cpu/ops.h"

namespace moesh {

absl::StatusOr<std::unique_ptr<RemoteExpertClient>> RemoteExpertClient::Create(
    Transport* transport, const ExpertPlacement& placement, int num_experts,
    std::chrono::milliseconds retry_after, Metrics* metrics, DispatchWire wire) {
  std::unique_ptr<RemoteExpertClient> c(
      new RemoteExpertClient(transport, num_experts, retry_after, wire));
  RETURN_IF_ERROR(c->UpdatePlacement(placement));
  if (metrics != nullptr) {
    c->roundtrip_ =
        &metrics
             ->HistogramFamily("moesh_expert_roundtrip_seconds",
                               "Attention-to-expert round trip of one MoE layer (dispatch, expert "
                               "FFNs, combine).")
             .Add({{"transport", std::string(transport->name())}}, Metrics::LatencyBuckets());
    c->errors_ = &metrics->CounterFamily("moesh_transport_errors_total", "Failed data-plane calls.")
                      .Add({{"transport", std::string(transport->name())}});
    c->hidden_bytes_ =
        &metrics
             ->CounterFamily("moesh_expert_dispatch_bytes_total",
                             "Hidden-state bytes of host dispatches sent to expert workers, as "
                             "encoded on the wire (--dispatch_dtype; FP8 scales included).")
             .Add({{"transport", std::string(transport->name())},
                   {"encoding", WireDTypeName(wire.hidden)}});
  }
  return c;
}

absl::Status RemoteExpertClient::UpdatePlacement(const ExpertPlacement& placement) {
  auto next = std::make_shared<Routing>();
  next->hosts.resize(num_experts_);
  for (const auto& [address, experts] : placement) {
    const int w = static_cast<int>(next->workers.size());
    next->workers.push_back({address});
    for (int e : experts) {
      if (e < 0 || e >= num_experts_) {
        return absl::InvalidArgumentError(
            absl::StrCat(address, " claims expert ", e, " outside [0, ", num_experts_, ")"));
      }
      next->hosts[e].push_back(w);
    }
  }
  for (int e = 0; e < num_experts_; ++e) {
    if (next->hosts[e].empty())
      return absl::InvalidArgumentError(absl::StrCat("no expert worker hosts expert ", e));
  }
  // Connected before the switch (outside mu_: a handshake may take a while).
  for (size_t w = 0; w < next->workers.size(); ++w) {
    ASSIGN_OR_RETURN(std::shared_ptr<DataChannel> ch, Channel(next->workers[w].address));
    const int device = ch->memory_kinds().device;
    next->kinds.device = w == 0 ? device : (device == next->kinds.device ? device : -1);
  }
  absl::MutexLock lock(&mu_);
  routing_ = std::move(next);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<DataChannel>> RemoteExpertClient::Channel(
    const std::string& address) {
  {
    absl::MutexLock lock(&mu_);
    auto it = channels_.find(address);
    if (it != channels_.end()) return it->second;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<DataChannel> made, transport_->Connect(address));
  absl::MutexLock lock(&mu_);
  std::shared_ptr<DataChannel>& ch = channels_[address];
  if (ch == nullptr) ch = std::move(made);  // else another caller connected first: use theirs
  return ch;
}

std::shared_ptr<const RemoteExpertClient::Routing> RemoteExpertClient::routing() const {
  absl::MutexLock lock(&mu_);
  return routing_;
}

absl::StatusOr<std::vector<int>> RemoteExpertClient::Route(const Routing& routing) {
  const auto now = std::chrono::steady_clock::now();
  absl::MutexLock lock(&mu_);
  // Replicas take turns, dispatch by dispatch (shifted per expert), so an
  // expert's tokens spread evenly over its live replicas, as the rebalancer
  // (router/eplb.h) plans them.
  const uint64_t turn = turn_++;
  std::vector<int> route(routing.hosts.size(), -1);
  std::vector<int> live;
  for (size_t e = 0; e < routing.hosts.size(); ++e) {
    live.clear();
    for (int w : routing.hosts[e]) {
      auto down = down_until_.find(routing.workers[w].address);
      if (down == down_until_.end() || down->second <= now) live.push_back(w);
    }
    if (!live.empty()) route[e] = live[(turn + e) % live.size()];
    if (route[e] < 0) {
      return absl::UnavailableError(absl::StrCat("expert ", e, " has no live replica (last host ",
                                                 routing.workers[routing.hosts[e].back()].address,
                                                 " is down)"));
    }
  }
  return route;
}

void RemoteExpertClient::MarkDown(const std::string& address) {
  std::shared_ptr<DataChannel> dropped;  // destroyed outside mu_
  absl::MutexLock lock(&mu_);
  down_until_[address] = std::chrono::steady_clock::now() + retry_after_;
  auto it = channels_.find(address);
  if (it != channels_.end()) {
    dropped = std::move(it->second);
    channels_.erase(it);
  }
}

absl::Status RemoteExpertClient::DropWorker(const std::string& address, const absl::Status& error,
                                            absl::string_view when) {
  MarkDown(address);
  if (errors_ != nullptr) errors_->Increment();
  absl::Status lost =
      absl::UnavailableError(absl::StrCat("expert worker ", address, " failed: ", error.message()));
  std::cerr << lost.message() << " (" << when << "; routing around it for "
            << std::chrono::duration_cast<std::chrono::seconds>(retry_after_).count() << " s)"
            << std::endl;
  return lost;
}

namespace {
// A dispatch running on the client's pool.
class PoolPending : public PendingDispatch {
 public:
  struct State {
    absl::Notification done;
    absl::Status status;
  };
  explicit PoolPending(std::shared_ptr<State> state) : state_(std::move(state)) {}
  ~PoolPending() override { state_->done.WaitForNotification(); }  // its buffers are the caller's
  absl::Status Wait() override {
    state_->done.WaitForNotification();
    return state_->status;
  }

 private:
  const std::shared_ptr<State> state_;
};
}  // namespace

std::unique_ptr<PendingDispatch> RemoteExpertClient::Start(const MoeDispatch& d, float* out) {
  auto state = std::make_shared<PoolPending::State>();
  pool_.Schedule([this, d, out, state] {
    state->status = Run(d, out);
    state->done.Notify();
  });
  return std::make_unique<PoolPending>(std::move(state));
}

absl::Status RemoteExpertClient::Run(const MoeDispatch& d, float* out) {
  auto once = [&](const Routing& routing) { return RunOnce(routing, d, out); };
  if (d.memory.is_host()) return WithFailover(once);
  absl::MutexLock serial(&device_mu_);
  return WithFailover(once);
}

MemoryKinds RemoteExpertClient::memory_kinds() const { return routing()->kinds; }

template <typename Once>
absl::Status RemoteExpertClient::WithFailover(Once once) {
  const auto start = std::chrono::steady_clock::now();
  absl::Status s;
  const std::shared_ptr<const Routing> routing = this->routing();  // one placement per dispatch
  // Each failed attempt takes at least one worker out of the routes.
  for (size_t attempt = 0; attempt < routing->workers.size(); ++attempt) {
    s = once(*routing);
    if (s.ok()) {
      if (roundtrip_ != nullptr) {
        roundtrip_->Observe(
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      return s;
    }
    if (s.code() != absl::StatusCode::kUnavailable && s.code() != absl::StatusCode::kDataLoss)
      return s;
  }
  return s;
}

absl::Status RemoteExpertClient::CheckDeviceDispatches() {
  absl::MutexLock serial(&device_mu_);
  std::vector<std::pair<std::string, std::shared_ptr<DataChannel>>> channels;
  {
    absl::MutexLock lock(&mu_);
    channels.assign(channels_.begin(), channels_.end());
  }
  absl::Status failed = std::exchange(device_suspect_, absl::OkStatus());
  for (const auto& [address, channel] : channels) {
    const absl::Status s = channel->CheckCollected();
    if (s.ok()) continue;
    const bool worker_gone = s.code() == absl::StatusCode::kUnavailable ||
                             s.code() == absl::StatusCode::kDeadlineExceeded ||
                             s.code() == absl::StatusCode::kDataLoss;
    if (!worker_gone) {  // a refusal (a malformed dispatch): the caller's to see
      if (failed.ok()) failed = s;
      continue;
    }
    const absl::Status lost = DropWorker(address, s, "after its device dispatches");
    if (failed.ok() || failed.code() != absl::StatusCode::kUnavailable) failed = lost;
  }
  return failed;
}

absl::Status RemoteExpertClient::RunOnce(const Routing& routing, const MoeDispatch& d, float* out) {
  RETURN_IF_ERROR(CheckDispatchMemory(d, routing.kinds, "the expert workers' transport"));
  ASSIGN_OR_RETURN(std::vector<int> route, Route(routing));
  return d.memory.is_host() ? RunHost(routing, route, d, out) : RunDevice(routing, route, d, out);
}

absl::Status RemoteExpertClient::Blame(const Routing& routing, const MoeDispatch& d,
                                       absl::FunctionRef<const absl::Status&(int w)> status) {
  absl::Status failed;
  for (int w = 0; w < static_cast<int>(routing.workers.size()); ++w) {
    const absl::Status& s = status(w);
    if (s.ok()) continue;
    if (!d.memory.is_host() && s.code() == absl::StatusCode::kInvalidArgument) return s;
    const absl::Status lost =
        DropWorker(routing.workers[w].address, s, absl::StrCat("layer ", d.layer));
    if (s.code() != absl::StatusCode::kDataLoss) {
      failed = lost;
    } else if (failed.ok()) {
      failed = s;
    }
    if (device_suspect_.ok())
      device_suspect_ = failed;  // its earlier sums in this step may be unfinished
  }
  return failed;
}

absl::Status RemoteExpertClient::RunDevice(const Routing& routing, const std::vector<int>& route,
                                           const MoeDispatch& d, float* out) {
  const std::vector<Worker>& workers = routing.workers;
  const int w_count = static_cast<int>(workers.size());
  // Per worker, the experts it serves in this dispatch.
  std::vector<std::vector<uint8_t>> serve(w_count);
  for (int e = 0; e < num_experts_; ++e) {
    std::vector<uint8_t>& mask = serve[route[e]];
    if (mask.empty()) mask.assign(num_experts_, 0);
    mask[e] = 1;
  }
  // Every worker starts before any is waited for; every posted one is
  // collected (in worker order: the sum is the same each time).
  std::vector<absl::Status> status(w_count);
  std::vector<std::shared_ptr<DataChannel>> channels(w_count);
  for (int w = 0; w < w_count; ++w) {
    if (serve[w].empty()) continue;
    absl::StatusOr<std::shared_ptr<DataChannel>> ch = Channel(workers[w].address);
    if (!ch.ok()) {
      status[w] = absl::UnavailableError(absl::StrCat("cannot reach it: ", ch.status().message()));
      continue;
    }
    MoeDispatch mine = d;
    mine.serve = serve[w].data();
    mine.num_experts = num_experts_;
    status[w] = (*ch)->Post(mine);
    if (status[w].ok()) channels[w] = std::move(*ch);
  }
  absl::Status local;  // this process's own failure, blaming no worker
  for (int w = 0; w < w_count; ++w) {
    const absl::StatusCode code = status[w].code();
    if (!serve[w].empty() && channels[w] == nullptr && code != absl::StatusCode::kUnavailable &&
        code != absl::StatusCode::kDeadlineExceeded && local.ok()) {
      local = status[w];
    }
  }
  bool first = true;
  for (int w = 0; w < w_count; ++w) {
    if (channels[w] == nullptr) continue;
    status[w] = channels[w]->Collect(out, /*accumulate=*/!first);
    first = first && !status[w].ok();
  }
  if (!local.ok()) return local;
  return Blame(routing, d, [&](int w) -> const absl::Status& { return status[w]; });
}

absl::Status RemoteExpertClient::RunHost(const Routing& routing, const std::vector<int>& route,
                                         const MoeDispatch& d, float* out) {
  const std::vector<Worker>& workers = routing.workers;
  const int w_count = static_cast<int>(workers.size());
  // Per worker: the tokens it sees (compacted) and their pairs (-1 elsewhere).
  struct Part {
    std::vector<int> rows;  // row -> token index
    std::vector<float> hidden_states;
    std::vector<int32_t> topk_ids;
    std::vector<float> topk_weights;
    std::vector<float> out;
    int pairs = 0;  // (token, expert) pairs routed here
    absl::Status status;
  };
  std::vector<Part> parts(w_count);
  for (int t = 0; t < d.num_tokens; ++t) {
    for (int k = 0; k < d.top_k; ++k) {
      const int e = d.topk_ids[t * d.top_k + k];
      if (e < 0 || e >= static_cast<int>(route.size())) {
        return absl::InvalidArgumentError(absl::StrCat("expert id ", e, " out of range"));
      }
      Part& p = parts[route[e]];
      if (p.rows.empty() || p.rows.back() != t) {
        p.rows.push_back(t);
        p.topk_ids.resize(p.topk_ids.size() + d.top_k, -1);
        p.topk_weights.resize(p.topk_weights.size() + d.top_k, 0.0f);
      }
      const size_t slot = (p.rows.size() - 1) * d.top_k + k;
      ++p.pairs;
      p.topk_ids[slot] = e;
      p.topk_weights[slot] = d.topk_weights[t * d.top_k + k];
    }
  }
  const size_t row_floats = static_cast<size_t>(d.hidden);
  bool whole = false;
  int sends = 0;
  for (const Part& p : parts) {
    whole = whole || p.pairs == d.num_tokens * d.top_k;
    sends += p.rows.empty() ? 0 : 1;
  }
  absl::BlockingCounter sent(sends);
  for (int w = 0; w < w_count; ++w) {
    Part& p = parts[w];
    if (p.rows.empty()) continue;
    // A worker with every pair (one worker, or one hosting all the experts
    // routed to) takes the dispatch as it is and writes `out` itself.
    MoeDispatch mine = d;
    mine.wire = wire_;
    float* dst = out;
    if (!whole) {
      p.hidden_states.resize(p.rows.size() * row_floats);
      for (size_t i = 0; i < p.rows.size(); ++i) {
        std::memcpy(p.hidden_states.data() + i * row_floats,
                    d.hidden_f32() + static_cast<size_t>(p.rows[i]) * row_floats,
                    row_floats * sizeof(float));
      }
      p.out.resize(p.rows.size() * row_floats);
      mine.num_tokens = static_cast<int>(p.rows.size());
      mine.hidden_states = p.hidden_states.data();
      mine.topk_ids = p.topk_ids.data();
      mine.topk_weights = p.topk_weights.data();
      dst = p.out.data();
    }
    if (hidden_bytes_ != nullptr) {
      hidden_bytes_->Increment(
          static_cast<double>(WireHiddenBytes(wire_.hidden, mine.num_tokens, mine.hidden)));
    }
    pool_.Schedule([&, w, mine, dst] {
      absl::StatusOr<std::shared_ptr<DataChannel>> ch = Channel(workers[w].address);
      parts[w].status =
          ch.ok()
              ? (*ch)->Dispatch(mine, dst)
              : absl::UnavailableError(absl::StrCat("cannot reach it: ", ch.status().message()));
      sent.DecrementCount();
    });
  }
  sent.Wait();
  RETURN_IF_ERROR(Blame(routing, d, [&](int w) -> const absl::Status& { return parts[w].status; }));
  if (whole) return absl::OkStatus();
  std::fill(out, out + static_cast<size_t>(d.num_tokens) * d.hidden, 0.0f);
  for (const Part& p : parts) {
    for (size_t i = 0; i < p.rows.size(); ++i) {
      cpu::Axpy(1.0f, p.out.data() + i * row_floats,
                out + static_cast<size_t>(p.rows[i]) * row_floats, d.hidden);
    }
  }
  return absl::OkStatus();
}

}  // namespace moesh
