// cuda_dispatch_bench: one MoE layer's attention -> experts -> attention
// round trip at DeepSeek-V2-Lite's shapes (hidden 2048, 64 routed experts,
// top-6, moe_intermediate 1408; random weights on the device), as an
// attention worker makes it through RemoteExpertClient, over each transport:
//   --transport (cuda_ipc, or nccl with --server-device 1) — the dispatch
//              stays in device memory (ExpertClient::Run of a device dispatch);
//   host     — fp32 hidden states through the host (Run): over gRPC for
//              cuda_ipc, staged through pinned host buffers for nccl;
// against, in the same run, what no transport can remove:
//   experts alone — the same experts computed in this process on the same
//                   device buffers (CudaExpertStage::Accumulate of a device dispatch);
//   empty call    — a dispatch of 0 tokens over the transport: the two
//                   processes' wake-ups, no GPU work;
//   copy          — the device-to-device copy rate (the payload's ceiling);
//   nccl raw      — (nccl) the same bytes as a bare NCCL send and receive
//                   between the two GPUs, and NCCL's bandwidth on 256 MiB.
// Then whole decode steps (CudaModel::Step, as a decode worker runs them)
// with the experts on the device (one CUDA graph per step) against the
// experts behind one worker over the transport (piecewise graphs, a
// hand-off per MoE layer), at --context tokens of cache per sequence.
// Expert workers are separate processes (forked before this one starts
// CUDA), each an ExpertService on its own CudaExpertStage holding 64/W
// experts, serving the transport and gRPC on one port; on this GPU (shared
// with this process, as in `moesh bench --serving --modes cluster-ipc`) or
// on --server-device.
//
// With --overlap, also the decode batches as two half-batches stepped at
// once (two attention models on this GPU, each with its own channels): what
// ping-pong micro-batching (each half's attention overlapping the other's
// expert round trip) can gain at best on this path.
//
// Usage: cuda_dispatch_bench [--transport cuda_ipc|nccl] [--overlap] [--workers 1,2] [--batch
// 1,32,128,256]
//          [--reps 30] [--server-device N[,M...]] [--step-batch 1,32,128,256] [--context 512]
//          [--steps 20]
// (--server-device: the expert workers' GPUs, taken in turn: 1,2,3 puts W
// workers on three GPUs.)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "base/dtype.h"
#include "base/status.h"
#include "common/cuda_backend/cuda_expert_stage.h"
#include "common/cuda_backend/cuda_model.h"
#include "common/cuda_backend/nccl_link.h"
#include "common/model/random_checkpoint.h"
#include "common/transport/cuda_ipc_transport.h"
#include "common/transport/nccl_transport.h"
#include "common/transport/remote_expert_client.h"
#include "expert_worker/expert_service.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/fill.h"
#include "tools/bench/bench_util.h"

namespace moesh::cuda {
namespace {

constexpr int kLayer = 1;  // V2-Lite's first MoE layer

struct Flags {
  std::string transport = "cuda_ipc";  // or "nccl"
  std::vector<int> workers = {1, 2};
  std::vector<int> batch = {1, 32, 128, 256};
  int reps = 30;
  std::vector<int> server_devices = {
      0};  // the expert workers' GPUs, in turn (this process uses GPU 0)
  std::vector<int> step_batch = {1, 32, 128, 256};  // empty: no decode-step table
  int context = 512;
  int steps = 20;
  bool overlap = false;  // also two half-batch steps at once (what ping-pong can gain)
};

absl::StatusOr<std::vector<int>> Ints(const std::string& s) {
  std::vector<int> v;
  for (absl::string_view p : absl::StrSplit(s, ',')) {
    int x = 0;
    if (!absl::SimpleAtoi(p, &x) || x < 0)
      return absl::InvalidArgumentError(absl::StrCat("not a count: ", p));
    v.push_back(x);
  }
  return v;
}

std::set<int> ShardOf(int index, int count, int experts) {
  std::set<int> ids;
  for (int e = index * experts / count; e < (index + 1) * experts / count; ++e) ids.insert(e);
  return ids;
}

// A child process: serves `ids` on GPU 0 until its control pipe closes.
// Writes its port (or 0) to `port_fd`.
[[noreturn]] void ServeExperts(const ModelConfig& config, const std::string& transport,
                               std::set<int> ids, int device, int port_fd, int control_fd) {
  int port = 0;
  absl::Status s = [&]() -> absl::Status {
    RETURN_IF_ERROR(UseDevice(device));
    ASSIGN_OR_RETURN(std::unique_ptr<ExpertShardWeights> w,
                     ExpertShardWeights::Placeholder(config, ids));
    ASSIGN_OR_RETURN(std::unique_ptr<CudaExpertStage> stage,
                     CudaExpertStage::Create(config, std::move(w)));
    ExpertServiceOptions o;
    o.batch_window = std::chrono::microseconds(0);
    ExpertService service(std::move(stage), config.Fingerprint(), o);
    std::unique_ptr<CudaIpcDataPlaneServer> ipc;
    std::unique_ptr<NcclDataPlaneServer> nccl;
    if (transport == "nccl") {
      ASSIGN_OR_RETURN(nccl, NcclDataPlaneServer::Start("127.0.0.1:0", device, &service, nullptr));
      port = nccl->port();
    } else {
      ASSIGN_OR_RETURN(ipc,
                       CudaIpcDataPlaneServer::Start("127.0.0.1:0", device, &service, nullptr));
      port = ipc->port();
    }
    if (write(port_fd, &port, sizeof(port)) != sizeof(port))
      return absl::InternalError("port pipe");
    char c;
    while (read(control_fd, &c, 1) > 0) {
    }
    return absl::OkStatus();
  }();
  if (!s.ok()) {
    std::fprintf(stderr, "expert server: %s\n", std::string(s.message()).c_str());
    if (port == 0) (void)!write(port_fd, &port, sizeof(port));
    _exit(1);
  }
  _exit(0);
}

struct Children {
  std::vector<pid_t> pids;
  std::vector<int> ports;
  int control_fd = -1;  // closing it stops them
  ~Children() {
    if (control_fd >= 0) close(control_fd);
    // Later fleets inherited this fleet's control pipe: stop them outright.
    for (pid_t p : pids) kill(p, SIGTERM);
    for (pid_t p : pids) waitpid(p, nullptr, 0);
  }
};

absl::Status Spawn(const ModelConfig& config, const std::string& transport, int count,
                   const std::vector<int>& devices, Children* out) {
  int control[2];
  if (pipe(control) != 0) return absl::InternalError("pipe");
  out->control_fd = control[1];
  for (int i = 0; i < count; ++i) {
    int ports[2];
    if (pipe(ports) != 0) return absl::InternalError("pipe");
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError("fork");
    if (pid == 0) {
      close(control[1]);
      close(ports[0]);
      ServeExperts(config, transport, ShardOf(i, count, config.n_routed_experts),
                   devices[i % devices.size()], ports[1], control[0]);
    }
    close(ports[1]);
    out->pids.push_back(pid);
    int port = 0;
    const bool got = read(ports[0], &port, sizeof(port)) == sizeof(port);
    close(ports[0]);
    if (!got || port == 0)
      return absl::UnavailableError(absl::StrCat("expert server ", i, " did not start"));
    out->ports.push_back(port);
  }
  close(control[0]);
  return absl::OkStatus();
}

template <typename Fn>
absl::StatusOr<double> HostMedianUs(int reps, Fn fn) {
  for (int i = 0; i < 3; ++i) RETURN_IF_ERROR(fn());
  std::vector<double> us(reps);
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(fn());
    us[i] =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  std::nth_element(us.begin(), us.begin() + reps / 2, us.end());
  return us[reps / 2];
}

// A bare NCCL exchange between GPU 0 and `peer_device`, in this process: per
// batch, the dispatch's bytes (bf16 hidden + ids + weights) out and the
// sums' (fp32) back, as one send and one receive on each side (the peer
// receives, then sends), host-timed median over `reps`; and the one-way
// bandwidth of 256 MiB messages.
struct NcclRaw {
  std::map<int, double> round_trip_us;
  double gbps = 0;
};
absl::StatusOr<NcclRaw> MeasureNcclRaw(const std::vector<int>& batches, int reps, int h, int k,
                                       int peer_device) {
  ASSIGN_OR_RETURN(ncclUniqueId id, NewNcclUniqueId());
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  absl::StatusOr<std::unique_ptr<NcclLink>> peer_link;
  std::thread joiner([&] { peer_link = NcclLink::Create(id, 1, peer_device, deadline); });
  absl::StatusOr<std::unique_ptr<NcclLink>> link = NcclLink::Create(id, 0, 0, deadline);
  joiner.join();
  RETURN_IF_ERROR(link.status());
  RETURN_IF_ERROR(peer_link.status());
  constexpr size_t kBig = size_t{256} << 20;
  const int warm = 3, big_reps = 5;
  auto out_bytes = [&](int b) { return static_cast<size_t>(b) * (h * 2 + k * 8); };
  auto back_bytes = [&](int b) { return static_cast<size_t>(b) * h * 4; };
  // The peer: its side of every exchange, in order.
  absl::Status peer_status;
  std::thread peer([&] {
    peer_status = [&]() -> absl::Status {
      RETURN_IF_ERROR(UseDevice(peer_device));
      ASSIGN_OR_RETURN(Stream st, Stream::Create());
      ASSIGN_OR_RETURN(DeviceBuffer<char> buf, DeviceBuffer<char>::Create(kBig));
      NcclLink& l = **peer_link;
      for (int b : batches) {
        for (int i = 0; i < warm + reps; ++i) {
          RETURN_IF_ERROR(l.Recv(buf.get(), out_bytes(b), st.get(), deadline + absl::Minutes(5)));
          RETURN_IF_ERROR(l.Send(buf.get(), back_bytes(b), st.get(), deadline + absl::Minutes(5)));
          RETURN_IF_ERROR(l.Wait(st.get(), deadline + absl::Minutes(5)));
        }
      }
      for (int i = 0; i < 1 + big_reps; ++i) {
        RETURN_IF_ERROR(l.Recv(buf.get(), kBig, st.get(), deadline + absl::Minutes(5)));
        RETURN_IF_ERROR(l.Wait(st.get(), deadline + absl::Minutes(5)));
      }
      return absl::OkStatus();
    }();
    if (!peer_status.ok()) (*peer_link)->Abort();
  });
  NcclRaw raw;
  absl::Status mine = [&]() -> absl::Status {
    RETURN_IF_ERROR(UseDevice(0));
    ASSIGN_OR_RETURN(Stream st, Stream::Create());
    ASSIGN_OR_RETURN(DeviceBuffer<char> buf, DeviceBuffer<char>::Create(kBig));
    NcclLink& l = **link;
    const absl::Time end = deadline + absl::Minutes(5);
    for (int b : batches) {
      ASSIGN_OR_RETURN(raw.round_trip_us[b], HostMedianUs(reps, [&]() -> absl::Status {
                         RETURN_IF_ERROR(l.Send(buf.get(), out_bytes(b), st.get(), end));
                         RETURN_IF_ERROR(l.Recv(buf.get(), back_bytes(b), st.get(), end));
                         return l.Wait(st.get(), end);
                       }));
    }
    RETURN_IF_ERROR(l.Send(buf.get(), kBig, st.get(), end));  // warm-up
    RETURN_IF_ERROR(l.Wait(st.get(), end));
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < big_reps; ++i) RETURN_IF_ERROR(l.Send(buf.get(), kBig, st.get(), end));
    RETURN_IF_ERROR(l.Wait(st.get(), end));
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    raw.gbps = big_reps * static_cast<double>(kBig) / sec / 1e9;
    return absl::OkStatus();
  }();
  if (!mine.ok()) (*link)->Abort();
  peer.join();
  RETURN_IF_ERROR(mine);
  RETURN_IF_ERROR(peer_status);
  return raw;
}

// One CudaModel's decode steps at `f.context` tokens of cache per sequence,
// the routed experts on its device (`experts` null) or behind `experts`.
struct StepRunner {
  std::unique_ptr<CudaModel> model;
  ExpertClient* experts = nullptr;
  std::mt19937 rng{3};

  static absl::StatusOr<StepRunner> Make(const Flags& f, const ModelConfig& c,
                                         ExpertClient* experts) {
    CudaModelOptions o;
    o.max_num_seqs = *std::max_element(f.step_batch.begin(), f.step_batch.end());
    const int per_seq = f.context + f.steps + 8;
    o.max_model_len = per_seq + 64;
    o.max_kv_blocks = (o.max_num_seqs * ((per_seq + 63) / 64 + 1));
    o.routed_experts_on_device = experts == nullptr;
    StepRunner r;
    r.experts = experts;
    ASSIGN_OR_RETURN(r.model, CudaModel::Dummy(c, 1, o));
    RETURN_IF_ERROR(r.model->FillKvCacheRandom(2));
    return r;
  }
  // Host times (ms) of `f.steps` decode steps of `b` sequences, after 3
  // warm-up steps (the first captures); `before_each` runs before each.
  absl::StatusOr<std::vector<double>> Run(const Flags& f, int b,
                                          const std::function<void()>& before_each = nullptr) {
    const ModelConfig& c = model->config();
    std::uniform_int_distribution<int32_t> tok(2, c.vocab_size - 1);
    ASSIGN_OR_RETURN(const std::vector<int> seqs, model->AddSyntheticSequences(b, f.context));
    std::vector<std::vector<int32_t>> next(b, std::vector<int32_t>(1));
    std::vector<SequenceTokens> batch(b);
    std::vector<double> ms;
    for (int step = 0; step < f.steps + 3; ++step) {
      for (int i = 0; i < b; ++i) {
        next[i][0] = tok(rng);
        batch[i] = {seqs[i], next[i]};
      }
      if (before_each) before_each();
      const auto t0 = std::chrono::steady_clock::now();
      ASSIGN_OR_RETURN(StepOutput unused, model->Step(batch, 0, experts));
      if (step >= 3)
        ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
    }
    if (!model->last_step_used_graph())
      return absl::InternalError("the decode steps did not replay graphs");
    for (int id : seqs) RETURN_IF_ERROR(model->ReleaseSequence(id));
    return ms;
  }
};

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Median host time of decode steps (inputs in, graph(s), ids out) at each
// batch, `experts` null: on the device.
absl::StatusOr<std::map<int, double>> StepTimes(const Flags& f, const ModelConfig& c,
                                                ExpertClient* experts) {
  ASSIGN_OR_RETURN(StepRunner r, StepRunner::Make(f, c, experts));
  std::map<int, double> out;
  for (int b : f.step_batch) {
    ASSIGN_OR_RETURN(std::vector<double> ms, r.Run(f, b));
    out[b] = Median(std::move(ms));
  }
  return out;
}

// What ping-pong micro-batching can gain at best: two half-batches stepped
// at once, each by its own CudaModel on this GPU with its own client (its
// own channels to the workers), on two threads — each half's attention free
// to overlap the other's expert round trip, in whatever order the GPU and
// the workers take them. The median, per batch, of the later of the two
// halves' step times (the two threads start each step together).
absl::StatusOr<std::map<int, double>> OverlappedStepTimes(const Flags& f, const ModelConfig& c,
                                                          ExpertClient* a, ExpertClient* b) {
  ASSIGN_OR_RETURN(StepRunner ra, StepRunner::Make(f, c, a));
  ASSIGN_OR_RETURN(StepRunner rb, StepRunner::Make(f, c, b));
  std::map<int, double> out;
  for (int batch : f.step_batch) {
    if (batch < 2) continue;
    absl::Mutex mu;
    int round = 0;
    bool failed = false;
    auto sync = [&] {  // both halves begin each step together
      absl::MutexLock lock(&mu);
      const int target = (++round + 1) / 2 * 2;
      auto reached = [&] { return round >= target || failed; };
      mu.Await(absl::Condition(&reached));
    };
    auto done = [&](const absl::Status& s) {
      if (s.ok()) return;
      absl::MutexLock lock(&mu);
      failed = true;  // the other half stops waiting
    };
    absl::StatusOr<std::vector<double>> mb;
    std::thread other([&] {
      mb = rb.Run(f, batch - batch / 2, sync);
      done(mb.status());
    });
    absl::StatusOr<std::vector<double>> ma = ra.Run(f, batch / 2, sync);
    done(ma.status());
    other.join();
    RETURN_IF_ERROR(ma.status());
    RETURN_IF_ERROR(mb.status());
    std::vector<double> worst(ma->size());
    for (size_t i = 0; i < worst.size(); ++i) worst[i] = std::max((*ma)[i], (*mb)[i]);
    out[batch] = Median(std::move(worst));
  }
  return out;
}

absl::Status StepTable(const Flags& f, const ModelConfig& c, ExpertClient* remote,
                       ExpertClient* remote2) {
  ASSIGN_OR_RETURN(auto colocated, StepTimes(f, c, nullptr));
  ASSIGN_OR_RETURN(auto split, StepTimes(f, c, remote));
  std::map<int, double> overlapped;
  if (f.overlap) {
    ASSIGN_OR_RETURN(overlapped, OverlappedStepTimes(f, c, remote, remote2));
  }
  std::set<int> used(f.server_devices.begin(), f.server_devices.end());
  used.insert(0);
  const int gpus = static_cast<int>(used.size());
  std::printf(
      "\ndecode steps, %d tokens of context, greedy, median of %d (ms): experts on the device (one "
      "graph, "
      "1 GPU) vs behind one %s worker on GPU %d (piecewise graphs, %d hand-offs; %d GPU%s)\n",
      f.context, f.steps, f.transport.c_str(), f.server_devices.front(),
      c.num_hidden_layers - c.first_k_dense_replace, gpus, gpus > 1 ? "s" : "");
  std::printf(
      "| batch | colocated ms | %s ms | extra per hand-off us | colocated / %s | colocated tok/s | "
      "%s tok/s "
      "| %s tok/s per GPU |\n",
      f.transport.c_str(), f.transport.c_str(), f.transport.c_str(), f.transport.c_str());
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- |\n");
  const int handoffs = c.num_hidden_layers - c.first_k_dense_replace;
  for (int b : f.step_batch) {
    std::printf("| %d | %.3f | %.3f | %.1f | %.2f | %.0f | %.0f | %.0f |\n", b, colocated[b],
                split[b], 1e3 * (split[b] - colocated[b]) / handoffs, colocated[b] / split[b],
                1e3 * b / colocated[b], 1e3 * b / split[b], 1e3 * b / split[b] / gpus);
  }
  if (!f.overlap) return absl::OkStatus();
  std::printf(
      "\nthe same batches as two half-batches stepped at once (two attention models on GPU 0, each "
      "with its own "
      "%s channels: each half's attention free to overlap the other's experts; what ping-pong can "
      "gain)\n",
      f.transport.c_str());
  std::printf(
      "| batch | colocated ms | %s ms (whole) | two halves at once ms | colocated / two halves |\n",
      f.transport.c_str());
  std::printf("| --- | --- | --- | --- | --- |\n");
  for (const auto& [b, ms] : overlapped) {
    std::printf("| %d | %.3f | %.3f | %.3f | %.2f |\n", b, colocated[b], split[b], ms,
                colocated[b] / ms);
  }
  return absl::OkStatus();
}

absl::Status Run(const Flags& f) {
  ASSIGN_OR_RETURN(ModelConfig c, PresetConfig("v2-lite", "real"));
  const int h = c.hidden_size, k = c.num_experts_per_tok, e = c.n_routed_experts;
  const int max_batch = *std::max_element(f.batch.begin(), f.batch.end());
  // Every worker count's servers first: no CUDA or gRPC in this process before fork.
  std::vector<std::unique_ptr<Children>> fleets;
  for (int w : f.workers) {
    fleets.push_back(std::make_unique<Children>());
    RETURN_IF_ERROR(Spawn(c, f.transport, w, f.server_devices, fleets.back().get()));
  }

  RETURN_IF_ERROR(UseDevice(0));
  ASSIGN_OR_RETURN(Stream stream, Stream::Create());
  ASSIGN_OR_RETURN(std::unique_ptr<CublasGemm> gemm, CublasGemm::Create());
  ASSIGN_OR_RETURN(Ceilings ceil, MeasureCeilings(*gemm, stream.get()));
  // The dispatch: random hidden states, each token's top-6 distinct experts
  // drawn uniformly, random weights; the same on the host (fp32) for grpc.
  std::mt19937 rng(7);
  std::vector<float> h_x(static_cast<size_t>(max_batch) * h),
      h_w(static_cast<size_t>(max_batch) * k);
  std::vector<int32_t> h_ids(static_cast<size_t>(max_batch) * k);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& x : h_x) x = Bf16ToF32(F32ToBf16(u(rng)));
  for (int t = 0; t < max_batch; ++t) {
    std::vector<int> perm(e);
    for (int i = 0; i < e; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < k; ++j) h_ids[t * k + j] = perm[j], h_w[t * k + j] = 0.1f + 0.1f * j;
  }
  std::vector<uint16_t> h_xb(h_x.size());
  for (size_t i = 0; i < h_x.size(); ++i) h_xb[i] = F32ToBf16(h_x[i]);
  ASSIGN_OR_RETURN(DeviceBuffer<uint16_t> x, DeviceBuffer<uint16_t>::Create(h_xb.size()));
  ASSIGN_OR_RETURN(DeviceBuffer<int32_t> ids, DeviceBuffer<int32_t>::Create(h_ids.size()));
  ASSIGN_OR_RETURN(DeviceBuffer<float> wts, DeviceBuffer<float>::Create(h_w.size()));
  ASSIGN_OR_RETURN(DeviceBuffer<float> out,
                   DeviceBuffer<float>::Create(static_cast<size_t>(max_batch) * h));
  RETURN_IF_ERROR(x.CopyFrom(h_xb));
  RETURN_IF_ERROR(ids.CopyFrom(h_ids));
  RETURN_IF_ERROR(wts.CopyFrom(h_w));
  std::vector<float> host_out(static_cast<size_t>(max_batch) * h);
  auto device_dispatch = [&](int b) {
    MoeDispatch d;
    d.layer = kLayer, d.num_tokens = b, d.hidden = h, d.top_k = k;
    d.memory = DispatchMemory::CudaDevice(0);
    d.hidden_states = x.get(), d.topk_ids = ids.get(), d.topk_weights = wts.get();
    return d;
  };
  auto host_dispatch = [&](int b) {
    MoeDispatch d;
    d.layer = kLayer, d.num_tokens = b, d.hidden = h, d.top_k = k;
    d.hidden_states = h_x.data(), d.topk_ids = h_ids.data(), d.topk_weights = h_w.data();
    return d;
  };

  // The floor: every expert in this process, on the same buffers.
  std::set<int> all;
  for (int i = 0; i < e; ++i) all.insert(i);
  ASSIGN_OR_RETURN(std::unique_ptr<ExpertShardWeights> w_all,
                   ExpertShardWeights::Placeholder(c, all));
  ASSIGN_OR_RETURN(std::unique_ptr<CudaExpertStage> local,
                   CudaExpertStage::Create(c, std::move(w_all)));
  std::map<int, double> alone;
  for (int b : f.batch) {
    const MoeDispatch d = device_dispatch(b);
    ASSIGN_OR_RETURN(
        alone[b], HostMedianUs(f.reps, [&] { return local->Accumulate(d, out.get(), nullptr); }));
  }
  local.reset();

  std::printf(
      "attention side GPU 0, expert workers GPU %s (in turn); copy %.0f GB/s (read + write); "
      "V2-Lite MoE layer: hidden %d, %d experts top-%d, "
      "moe_intermediate %d, bf16\n",
      absl::StrJoin(f.server_devices, ",").c_str(), ceil.copy_gbps, h, e, k,
      c.moe_intermediate_size);
  std::printf(
      "round trip of one MoE layer, host-timed median of %d (us); payload = bf16 hidden + ids + "
      "weights "
      "out, fp32 sums back\n",
      f.reps);
  const bool nccl = f.transport == "nccl";
  NcclRaw raw;
  if (nccl) {
    ASSIGN_OR_RETURN(raw, MeasureNcclRaw(f.batch, f.reps, h, k, f.server_devices.front()));
    std::printf(
        "NCCL between GPU 0 and GPU %d, in this process: %.1f GB/s one way (256 MiB messages)\n",
        f.server_devices.front(), raw.gbps);
  }
  const char* t = f.transport.c_str();
  std::printf(
      "| workers | batch | payload KB | experts alone | %s | %s - alone | %s | empty %s call | %s "
      "|\n",
      t, t, nccl ? "nccl host-staged" : "grpc", t,
      nccl ? "bare NCCL send + recv of the payload" : "payload at copy rate");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::unique_ptr<Transport> step_transport;
  std::unique_ptr<RemoteExpertClient> step_client,
      step_client2;  // one worker, for the decode-step table
  for (size_t fi = 0; fi < f.workers.size(); ++fi) {
    const int wcount = f.workers[fi];
    ExpertPlacement placement;
    for (int i = 0; i < wcount; ++i) {
      const std::set<int> s = ShardOf(i, wcount, e);
      placement[absl::StrCat("127.0.0.1:", fleets[fi]->ports[i])] =
          std::vector<int>(s.begin(), s.end());
    }
    ASSIGN_OR_RETURN(std::unique_ptr<Transport> ipc_t, MakeTransport(f.transport, 0));
    ASSIGN_OR_RETURN(std::unique_ptr<RemoteExpertClient> ipc,
                     RemoteExpertClient::Create(ipc_t.get(), placement, e));
    // Attach at the largest size first, so no row pays for growing regions.
    RETURN_IF_ERROR(ipc->Run(device_dispatch(max_batch), out.get()));
    ASSIGN_OR_RETURN(double empty,
                     HostMedianUs(f.reps, [&] { return ipc->Run(device_dispatch(0), out.get()); }));
    for (int b : f.batch) {
      const MoeDispatch dd = device_dispatch(b);
      const MoeDispatch hd = host_dispatch(b);
      ASSIGN_OR_RETURN(double t_ipc, HostMedianUs(f.reps, [&] { return ipc->Run(dd, out.get()); }));
      // The host path of the same channels (cuda_ipc's goes over gRPC).
      ASSIGN_OR_RETURN(double t_grpc, HostMedianUs(std::max(5, f.reps / 3),
                                                   [&] { return ipc->Run(hd, host_out.data()); }));
      const double payload =
          static_cast<double>(b) * (h * 2 + k * 8) + static_cast<double>(b) * h * 4;
      std::printf("| %d | %d | %.0f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", wcount, b,
                  payload / 1024, alone[b], t_ipc, t_ipc - alone[b], t_grpc, empty,
                  nccl ? raw.round_trip_us[b] : 2 * payload / (ceil.copy_gbps * 1e3));
      std::fflush(stdout);
    }
    if (wcount == 1) {
      ASSIGN_OR_RETURN(step_client2,
                       RemoteExpertClient::Create(ipc_t.get(), placement, e));  // its own channels
      step_transport = std::move(ipc_t), step_client = std::move(ipc);
    }
  }
  if (step_client == nullptr || f.step_batch.empty()) return absl::OkStatus();
  return StepTable(f, c, step_client.get(), step_client2.get());
}

}  // namespace
}  // namespace moesh::cuda

int main(int argc, char** argv) {
  moesh::cuda::Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    absl::StatusOr<std::vector<int>> v = std::vector<int>{};
    if (a == "--workers") {
      v = moesh::cuda::Ints(value());
      if (v.ok()) f.workers = *v;
    } else if (a == "--transport") {
      f.transport = value();
      if (f.transport != "cuda_ipc" && f.transport != "nccl")
        v = absl::InvalidArgumentError("--transport: cuda_ipc or nccl");
    } else if (a == "--overlap") {
      f.overlap = true;
    } else if (a == "--batch") {
      v = moesh::cuda::Ints(value());
      if (v.ok()) f.batch = *v;
    } else if (a == "--server-device") {
      v = moesh::cuda::Ints(value());
      if (v.ok() && !v->empty()) {
        f.server_devices = *v;
      } else if (v.ok()) {
        v = absl::InvalidArgumentError("--server-device: CUDA ordinals");
      }
    } else if (a == "--step-batch") {
      v = moesh::cuda::Ints(value());
      if (v.ok()) f.step_batch = *v;
    } else if (a == "--context") {
      if (!absl::SimpleAtoi(value(), &f.context) || f.context < 1)
        v = absl::InvalidArgumentError("--context: tokens");
    } else if (a == "--steps") {
      if (!absl::SimpleAtoi(value(), &f.steps) || f.steps < 1)
        v = absl::InvalidArgumentError("--steps: a count");
    } else if (a == "--reps") {
      if (!absl::SimpleAtoi(value(), &f.reps) || f.reps < 1)
        v = absl::InvalidArgumentError("--reps: a count");
    } else {
      v = absl::InvalidArgumentError(absl::StrCat("unknown flag ", a));
    }
    if (!v.ok()) {
      std::fprintf(
          stderr,
          "cuda_dispatch_bench: %s\nusage: cuda_dispatch_bench [--transport cuda_ipc|nccl] "
          "[--overlap] [--workers 1,2] [--batch 1,32,128,256] [--reps 30] [--server-device "
          "N[,M...]] [--step-batch 1,32,128,256] [--context 512] [--steps 20]\n",
          std::string(v.status().message()).c_str());
      return 2;
    }
  }
  if (f.transport == "nccl" &&
      std::find(f.server_devices.begin(), f.server_devices.end(), 0) != f.server_devices.end()) {
    std::fprintf(stderr,
                 "cuda_dispatch_bench: --transport nccl needs --server-device N > 0 (NCCL joins no "
                 "two ranks on one GPU)\n");
    return 2;
  }
  const absl::Status s = moesh::cuda::Run(f);
  if (!s.ok()) {
    std::fprintf(stderr, "cuda_dispatch_bench: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
