// The CUDA pieces the services run on, against their references (the expert
// stage alone: cuda_expert_stage_test.cc):
//   * CudaAttentionBackend with the experts behind an ExpertClient (the
//     disaggregated attention worker: a host round trip per MoE layer, or
//     device-resident dispatches over cuda_ipc and nccl) against the same
//     model with its experts on the device: the same math, so the same
//     logits to the last bit and the same greedy tokens;
//   * the KV handoff between two CUDA backends (prefill → decode) against
//     decoding where the prompt ran: identical logits;
//   * Generate on the CUDA backend against the CPU engine on a golden
//     checkpoint, and the backend's error answers.
// Skips (with a message) where no GPU is present.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status.h"
#include "common/backend/backends.h"
#include "common/cuda_backend/cuda_expert_stage.h"
#include "common/cuda_backend/model_test_util.h"
#include "common/engine/attention_backend.h"
#include "common/engine/generate.h"
#include "common/engine/sampler.h"
#include "common/model/expert_client.h"
#include "common/model/model.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "common/transport/cuda_ipc_transport.h"
#include "common/transport/kv_handoff.h"
#include "common/transport/nccl_transport.h"
#include "common/transport/remote_expert_client.h"
#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

const std::string kGoldenV3 = testing::GoldenDir("v3");

using Loaded = testing::CheckedCheckpoint;
using testing::OpenChecked;

// The routed experts of a whole model on the GPU, as an ExpertClient (what
// an attention worker reaches through its RemoteExpertClient).
absl::StatusOr<std::unique_ptr<ExpertClient>> GpuExperts(const Loaded& m) {
  ASSIGN_OR_RETURN(auto w, ExpertShardWeights::Load(m.config, *m.ckpt, {}));
  ASSIGN_OR_RETURN(std::unique_ptr<CudaExpertStage> stage,
                   CudaExpertStage::Create(m.config, std::move(w)));
  return std::unique_ptr<ExpertClient>(new LocalExpertClient(std::move(stage)));
}

DeviceOptions Cuda() {
  DeviceOptions o;
  o.device = "cuda";
  o.gpu_memory_utilization = 0.5;
  o.max_num_seqs = 8;
  return o;
}

int Argmax(const std::vector<float>& logits, int row, int vocab) {
  const float* r = logits.data() + static_cast<size_t>(row) * vocab;
  return static_cast<int>(std::max_element(r, r + vocab) - r);
}

// Runs `prompts` as one batch, then `steps` greedy steps of all of them;
// returns every pass's logits.
std::vector<std::vector<float>> RunGreedy(AttentionBackend* b, ExpertClient* experts,
                                          const std::vector<std::vector<int32_t>>& prompts,
                                          int steps) {
  const int vocab = b->config().vocab_size;
  std::vector<std::unique_ptr<KvSequence>> seqs;
  for (const auto& p : prompts) {
    absl::StatusOr<std::unique_ptr<KvSequence>> s =
        b->NewSequence(static_cast<int>(p.size()) + steps);
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return {};
    seqs.push_back(std::move(*s));
  }
  std::vector<std::vector<int32_t>> next = prompts;
  std::vector<std::vector<float>> all;
  for (int step = 0; step <= steps; ++step) {
    std::vector<SequenceInput> in;
    for (size_t i = 0; i < seqs.size(); ++i) in.push_back({next[i], seqs[i].get()});
    absl::StatusOr<std::vector<float>> logits = b->Forward(in, experts);
    EXPECT_TRUE(logits.ok()) << logits.status();
    if (!logits.ok()) return all;
    for (size_t i = 0; i < seqs.size(); ++i)
      next[i] = {Argmax(*logits, static_cast<int>(i), vocab)};
    all.push_back(std::move(*logits));
  }
  return all;
}

TEST(CudaAttentionBackendTest, ExpertsBehindAClientEqualExpertsOnTheDevice) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(kGoldenV3));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> whole,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), true));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> split,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), false));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ExpertClient> experts, GpuExperts(m));
  EXPECT_TRUE(whole->has_experts());
  EXPECT_FALSE(split->has_experts());
  const std::vector<std::vector<int32_t>> prompts = {
      {5, 17, 300, 42, 9}, {1, 2, 3}, {400, 7, 7, 7, 100, 250, 3, 4}};
  const auto a = RunGreedy(whole.get(), nullptr, prompts, 8);
  const auto b = RunGreedy(split.get(), experts.get(), prompts, 8);
  ASSERT_EQ(a.size(), 9u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t step = 0; step < a.size(); ++step) {
    ASSERT_EQ(a[step].size(), b[step].size());
    double worst = 0;
    for (size_t i = 0; i < a[step].size(); ++i)
      worst = std::max(worst, std::fabs(double(a[step][i]) - b[step][i]));
    EXPECT_LE(worst, 1e-4) << "step " << step;
    for (size_t r = 0; r < prompts.size(); ++r) {
      EXPECT_EQ(Argmax(a[step], r, m.config.vocab_size), Argmax(b[step], r, m.config.vocab_size));
    }
  }
  // The wrong way round is refused, not run.
  std::unique_ptr<KvSequence> s = *split->NewSequence(4);
  const std::vector<int32_t> t = {1};
  SequenceInput in{t, s.get()};
  EXPECT_EQ(split->Forward({&in, 1}, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  std::unique_ptr<KvSequence> w = *whole->NewSequence(4);
  in.cache = w.get();
  EXPECT_EQ(whole->Forward({&in, 1}, experts.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A sequence of another backend.
  EXPECT_EQ(split->Forward({&in, 1}, experts.get()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// An expert worker's dispatch handler: its stage, counting the dispatches.
class StageHandler : public DispatchHandler {
 public:
  explicit StageHandler(std::unique_ptr<ExpertStage> stage) : stage_(std::move(stage)) {}
  absl::Status Dispatch(const MoeDispatch& d, float* out) override {
    ++calls;
    if (d.memory.is_host())  // the stage adds into host memory; a handler overwrites
      std::fill(out, out + static_cast<size_t>(d.num_tokens) * d.hidden, 0.0f);
    return stage_->Accumulate(d, out, nullptr);
  }
  std::atomic<int> calls{0};

 private:
  std::unique_ptr<ExpertStage> stage_;
};

// A device-resident client whose next `failures` checks report a worker lost
// under the step (as nccl reports it: after the fact).
class FlakyCheck : public ExpertClient {
 public:
  explicit FlakyCheck(ExpertClient* inner) : inner_(inner) {}
  absl::Status Run(const MoeDispatch& d, float* out) override { return inner_->Run(d, out); }
  MemoryKinds memory_kinds() const override { return inner_->memory_kinds(); }
  absl::Status CheckDeviceDispatches() override {
    ++checks;
    RETURN_IF_ERROR(inner_->CheckDeviceDispatches());
    if (failures == 0) return absl::OkStatus();
    --failures;
    return absl::UnavailableError("expert worker lost under the step (test)");
  }
  int failures = 0, checks = 0;

 private:
  ExpertClient* const inner_;
};

// Expert workers behind a device-resident transport, served in this
// process (the integration test crosses processes): cuda_ipc on this GPU
// (through the servers' pointers), and nccl with the workers on GPU 1 (NCCL
// joins no two ranks on one GPU). The attention backend's dispatch never
// leaves the GPUs, and with one worker holding every expert the logits
// equal the host path's to the bit.
class DeviceDispatchTest : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Transports, DeviceDispatchTest, ::testing::Values("cuda_ipc", "nccl"));

TEST_P(DeviceDispatchTest, DeviceResidentDispatchEqualsTheHostPath) {
  MOESH_REQUIRE_GPU();
  const bool nccl = GetParam() == "nccl";
  if (nccl && *CudaDeviceCount() < 2) {
    GTEST_SKIP()
        << "nccl needs two GPUs (NCCL joins no two ranks on one GPU); this machine has one";
  }
  const int server_device = nccl ? 1 : 0;
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(kGoldenV3));
  const ModelConfig& c = m.config;
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> split,
                             MakeAttentionBackend(c, m.ckpt.get(), Cuda(), false));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ExpertClient> host, GpuExperts(m));
  auto serve = [&](std::set<int> ids) -> std::unique_ptr<StageHandler> {
    absl::StatusOr<std::unique_ptr<ExpertShardWeights>> w =
        ExpertShardWeights::Load(c, *m.ckpt, ids);
    EXPECT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(cudaSetDevice(server_device), cudaSuccess);
    absl::StatusOr<std::unique_ptr<CudaExpertStage>> st = CudaExpertStage::Create(c, std::move(*w));
    cudaSetDevice(0);
    EXPECT_TRUE(st.ok()) << st.status();
    return std::make_unique<StageHandler>(std::move(*st));
  };
  // A server on `server_device`; its port.
  std::vector<std::shared_ptr<void>> servers;
  std::vector<int> ports;
  auto start = [&](StageHandler* handler) -> absl::Status {
    if (nccl) {
      ASSIGN_OR_RETURN(std::unique_ptr<NcclDataPlaneServer> s,
                       NcclDataPlaneServer::Start("127.0.0.1:0", server_device, handler, nullptr));
      ports.push_back(s->port());
      servers.push_back(std::move(s));
    } else {
      ASSIGN_OR_RETURN(
          std::unique_ptr<CudaIpcDataPlaneServer> s,
          CudaIpcDataPlaneServer::Start("127.0.0.1:0", server_device, handler, nullptr));
      ports.push_back(s->port());
      servers.push_back(std::move(s));
    }
    return absl::OkStatus();
  };
  std::set<int> all, low, high;
  for (int e = 0; e < c.n_routed_experts; ++e)
    (e < c.n_routed_experts / 2 ? low : high).insert(e), all.insert(e);
  std::vector<std::unique_ptr<StageHandler>> handlers;
  for (const std::set<int>* ids : {&all, &low, &high}) {
    handlers.push_back(serve(*ids));
    MOESH_ASSERT_OK(start(handlers.back().get()));
  }
  auto address = [&](int i) { return absl::StrCat("127.0.0.1:", ports[i]); };
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Transport> ipc, MakeTransport(GetParam(), 0));
  auto placement = [](const std::set<int>& ids) {
    return std::vector<int>(ids.begin(), ids.end());
  };
  MOESH_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<RemoteExpertClient> one,
      RemoteExpertClient::Create(ipc.get(), {{address(0), placement(all)}}, c.n_routed_experts));
  MOESH_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<RemoteExpertClient> two,
      RemoteExpertClient::Create(ipc.get(),
                                 {{address(1), placement(low)}, {address(2), placement(high)}},
                                 c.n_routed_experts));
  EXPECT_EQ(one->memory_kinds().device, 0);
  const std::vector<std::vector<int32_t>> prompts = {
      {5, 17, 300, 42, 9}, {1, 2, 3}, {400, 7, 7, 7, 100, 250, 3, 4}};
  const auto want = RunGreedy(split.get(), host.get(), prompts, 6);
  const auto got_one = RunGreedy(split.get(), one.get(), prompts, 6);
  const auto got_two = RunGreedy(split.get(), two.get(), prompts, 6);
  ASSERT_EQ(want.size(), 7u);
  ASSERT_EQ(got_one.size(), want.size());
  ASSERT_EQ(got_two.size(), want.size());
  EXPECT_GT(handlers[0]->calls.load(), 0);
  EXPECT_GT(handlers[1]->calls.load(), 0);
  EXPECT_GT(handlers[2]->calls.load(), 0);
  for (size_t step = 0; step < want.size(); ++step) {
    EXPECT_EQ(want[step], got_one[step])
        << "step " << step << ": one worker over cuda_ipc is not bit-equal";
    double worst = 0;
    for (size_t i = 0; i < want[step].size(); ++i) {
      worst = std::max(worst, std::fabs(double(want[step][i]) - got_two[step][i]));
    }
    EXPECT_LE(worst, 1e-4) << "step " << step << " (two shards: partial sums add in another order)";
  }
  // A worker lost under a step: the step runs again and its result stands
  // (the same logits to the bit); lost twice in a row, UNAVAILABLE.
  {
    FlakyCheck flaky(one.get());
    flaky.failures = 1;
    const auto again = RunGreedy(split.get(), &flaky, prompts, 6);
    ASSERT_EQ(again.size(), want.size());
    EXPECT_EQ(flaky.failures, 0);
    EXPECT_EQ(flaky.checks, static_cast<int>(want.size()) + 1);  // the first step checked twice
    for (size_t step = 0; step < want.size(); ++step)
      EXPECT_EQ(want[step], again[step]) << "step " << step;
    flaky.failures = 2;
    MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> seq, split->NewSequence(8));
    SequenceInput in{prompts[0], seq.get()};
    EXPECT_EQ(split->Forward({&in, 1}, &flaky).status().code(), absl::StatusCode::kUnavailable);
  }
  // Greedy decode steps (ForwardSample: the decode worker's path) replay
  // piecewise CUDA graphs with a device-resident client, cut at every
  // dispatch: the same ids and log-probabilities as the host path, eager.
  {
    auto greedy = [&](ExpertClient* experts) {
      std::vector<std::unique_ptr<KvSequence>> seqs;
      std::vector<std::vector<int32_t>> next = prompts;
      std::vector<SampledTokens> outs;
      SamplingParams params;  // greedy
      for (const auto& p : prompts)
        seqs.push_back(*split->NewSequence(static_cast<int>(p.size()) + 8));
      for (int step = 0; step < 6; ++step) {  // a prefill, then decode steps (the first captures)
        std::vector<SequenceInput> in;
        std::vector<SampleRequest> samples;
        for (size_t i = 0; i < seqs.size(); ++i) {
          in.push_back({next[i], seqs[i].get()});
          samples.push_back({&params, 0.0, prompts[i], {}});
        }
        absl::StatusOr<SampledTokens> o = split->ForwardSample(in, experts, samples, 3);
        EXPECT_TRUE(o.ok()) << o.status();
        if (!o.ok()) break;
        for (size_t i = 0; i < seqs.size(); ++i) next[i] = {o->ids[i]};
        outs.push_back(std::move(*o));
      }
      return outs;
    };
    const std::vector<SampledTokens> a = greedy(host.get());
    const int calls = handlers[0]->calls.load();
    const std::vector<SampledTokens> b = greedy(one.get());
    EXPECT_GE(handlers[0]->calls.load() - calls, 6);  // every step dispatched through the workers
    ASSERT_EQ(a.size(), 6u);
    ASSERT_EQ(b.size(), a.size());
    for (size_t step = 0; step < a.size(); ++step) {
      EXPECT_EQ(a[step].ids, b[step].ids) << "step " << step;
      for (size_t i = 0; i < a[step].top_logprobs.size(); ++i) {
        for (size_t j = 0; j < a[step].top_logprobs[i].size(); ++j) {
          EXPECT_EQ(a[step].top_logprobs[i][j].id, b[step].top_logprobs[i][j].id);
          EXPECT_EQ(a[step].top_logprobs[i][j].logprob, b[step].top_logprobs[i][j].logprob)
              << "step " << step;
        }
      }
    }
  }
  // A worker that goes away: its experts have no replica, so UNAVAILABLE
  // naming it; with a replica left (worker 0 hosts all), traffic moves there.
  servers[2].reset();
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> seq, split->NewSequence(4));
  const std::vector<int32_t> t = {1, 2};
  SequenceInput in{t, seq.get()};
  const absl::Status lost = split->Forward({&in, 1}, two.get()).status();
  EXPECT_EQ(lost.code(), absl::StatusCode::kUnavailable) << lost;
  MOESH_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<RemoteExpertClient> replicated,
      RemoteExpertClient::Create(ipc.get(),
                                 {{address(1), placement(low)}, {address(0), placement(all)}},
                                 c.n_routed_experts));
  const int before = handlers[0]->calls.load();
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> seq2, split->NewSequence(4));
  in.cache = seq2.get();
  EXPECT_TRUE(split->Forward({&in, 1}, replicated.get()).ok());
  EXPECT_GT(handlers[0]->calls.load(), before);

  // One channel by hand: nccl's answers come after the fact
  // (CheckCollected), a refused dispatch leaves the channel usable, and a
  // server that goes away frees the caller's stream and is reported.
  if (!nccl) return;
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<DataChannel> ch, ipc->Connect(address(0)));
  EXPECT_EQ(ch->memory_kinds().device, 0);
  const int tokens = 4, k = c.num_experts_per_tok;
  const size_t rows = static_cast<size_t>(tokens) * c.hidden_size,
               pairs = static_cast<size_t>(tokens) * k;
  MOESH_ASSERT_OK_AND_ASSIGN(DeviceBuffer<uint16_t> x, DeviceBuffer<uint16_t>::Create(rows));
  MOESH_ASSERT_OK_AND_ASSIGN(DeviceBuffer<int32_t> ids, DeviceBuffer<int32_t>::Create(pairs));
  MOESH_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> w, DeviceBuffer<float>::Create(pairs));
  MOESH_ASSERT_OK_AND_ASSIGN(DeviceBuffer<float> out, DeviceBuffer<float>::Create(rows));
  ASSERT_EQ(cudaMemset(x.get(), 0, rows * sizeof(uint16_t)), cudaSuccess);
  ASSERT_EQ(cudaMemset(ids.get(), 0, pairs * sizeof(int32_t)),
            cudaSuccess);  // expert 0 for every pair
  ASSERT_EQ(cudaMemset(w.get(), 0, pairs * sizeof(float)), cudaSuccess);
  MOESH_ASSERT_OK_AND_ASSIGN(Stream stream_owner, Stream::Create());
  cudaStream_t stream = stream_owner.get();
  auto dispatch = [&](int layer) {
    MoeDispatch d;
    d.layer = layer, d.num_tokens = tokens, d.hidden = c.hidden_size, d.top_k = k;
    d.memory = DispatchMemory::CudaDevice(0);
    d.hidden_states = x.get(), d.topk_ids = ids.get(), d.topk_weights = w.get(), d.stream = stream;
    absl::Status s = ch->Post(d);
    if (s.ok()) s = ch->Collect(out.get(), false);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    return s.ok() ? ch->CheckCollected() : s;
  };
  EXPECT_TRUE(dispatch(c.first_k_dense_replace).ok());
  const absl::Status dense = dispatch(0);  // not an MoE layer: refused, the transfer still done
  EXPECT_EQ(dense.code(), absl::StatusCode::kInvalidArgument) << dense;
  EXPECT_TRUE(dispatch(c.first_k_dense_replace).ok());
  servers[0].reset();
  absl::Status gone;
  for (int i = 0; i < 100 && gone.ok(); ++i) {  // the stream's end reaches the client's reader
    absl::SleepFor(absl::Milliseconds(50));
    gone = ch->CheckCollected();
  }
  EXPECT_EQ(gone.code(), absl::StatusCode::kUnavailable) << gone;
  EXPECT_EQ(dispatch(c.first_k_dense_replace).code(), absl::StatusCode::kUnavailable);
}

// Both ways of the KV handoff — rows through the host, and the decode side
// copying the prefill side's blocks device to device (cuda_ipc's; here two
// backends of one process) — continue the sequence exactly.
class KvHandoffTest : public ::testing::TestWithParam<KvHandoff> {};
INSTANTIATE_TEST_SUITE_P(HostAndDevice, KvHandoffTest,
                         ::testing::Values(KvHandoff::kHost, KvHandoff::kDevice));

TEST_P(KvHandoffTest, BetweenBackendsContinuesExactly) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(kGoldenV3));
  const int layers = m.config.num_hidden_layers, vocab = m.config.vocab_size;
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> prefill,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), false));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> decode,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), false));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ExpertClient> experts, GpuExperts(m));
  // 70 prompt tokens: the rows cross a block boundary.
  std::vector<int32_t> prompt(70);
  for (size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<int32_t>((i * 37 + 11) % vocab);
  const int steps = 6;
  // Another sequence first, so the two sides' block ids differ.
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> other, decode->NewSequence(200));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> here,
                             prefill->NewSequence(static_cast<int>(prompt.size()) + steps));
  SequenceInput in{prompt, here.get()};
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> first, prefill->Forward({&in, 1}, experts.get()));
  ASSERT_EQ(here->length(), static_cast<int>(prompt.size()));

  MOESH_ASSERT_OK_AND_ASSIGN(const KvTransfer msg, SerializeKv("r", *here, layers, GetParam()));
  EXPECT_EQ(msg.device.has_value(), GetParam() == KvHandoff::kDevice);
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> there,
                             decode->NewSequence(static_cast<int>(prompt.size()) + steps));
  MOESH_ASSERT_OK(DeserializeKv(msg, layers, there.get()));
  ASSERT_EQ(there->length(), here->length());
  // The rows came back as they left (bf16 → float → bf16 is exact; device copies are bytes).
  std::vector<float> s1, s2;
  for (int l = 0; l < layers; ++l) {
    const float* a = here->Rows(l, &s1);
    const float* b = there->Rows(l, &s2);
    ASSERT_EQ(here->num_rows(l), there->num_rows(l));
    EXPECT_TRUE(std::equal(a, a + static_cast<size_t>(here->num_rows(l)) * here->row_width(), b))
        << "layer " << l;
  }
  if (GetParam() ==
      KvHandoff::kDevice) {  // a second delivery, a forged handle, a block out of range
    EXPECT_EQ(DeserializeKv(msg, layers, there.get()).code(),
              absl::StatusCode::kFailedPrecondition);
    MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> t2,
                               decode->NewSequence(static_cast<int>(prompt.size())));
    KvTransfer forged = msg;
    forged.device->pool_handle = std::string(64, 'x');
    EXPECT_EQ(DeserializeKv(forged, layers, t2.get()).code(),
              absl::StatusCode::kFailedPrecondition);
    // The rows can still come through the host into that sequence.
    MOESH_ASSERT_OK_AND_ASSIGN(const KvTransfer rows,
                               SerializeKv("r", *here, layers, KvHandoff::kHost));
    MOESH_ASSERT_OK(DeserializeKv(rows, layers, t2.get()));
    EXPECT_EQ(t2->length(), static_cast<int>(prompt.size()));
    MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> t3,
                               decode->NewSequence(static_cast<int>(prompt.size())));
    KvTransfer far = msg;
    far.device->blocks[0] = far.device->num_blocks;
    EXPECT_EQ(DeserializeKv(far, layers, t3.get()).code(), absl::StatusCode::kInvalidArgument);
  }
  int32_t tok = Argmax(first, 0, vocab);
  for (int step = 0; step < steps; ++step) {
    const std::vector<int32_t> t = {tok};
    SequenceInput a{t, here.get()}, b{t, there.get()};
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> la, prefill->Forward({&a, 1}, experts.get()));
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> lb, decode->Forward({&b, 1}, experts.get()));
    EXPECT_EQ(la, lb) << "step " << step;
    tok = Argmax(la, 0, vocab);
  }
  // The reservation holds: more tokens than its blocks take are refused.
  ASSERT_GE(there->capacity(), static_cast<int>(prompt.size()) + steps);
  const std::vector<int32_t> t(there->capacity() - there->length() + 1, tok);
  SequenceInput over{t, there.get()};
  EXPECT_EQ(decode->Forward({&over, 1}, experts.get()).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// The sampling step keeps the logits on the device (graphs for decode steps
// when the experts are there) and samples there; it must pick what Sampler
// picks from Forward's logits with the same draw — greedy, hot with every cut
// and penalty, plain temperature — with Sampler's log-probabilities. More than
// 20 log-probabilities take the host path, with the same result.
TEST(CudaAttentionBackendTest, ForwardSampleEqualsSamplerOnForwardsLogits) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(kGoldenV3));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<ExpertClient> experts, GpuExperts(m));
  const int vocab = m.config.vocab_size;
  std::vector<SamplingParams> params(3);
  params[1].temperature = 0.9f, params[1].top_k = 40, params[1].top_p = 0.92f,
  params[1].min_p = 0.02f;
  params[1].repetition_penalty = 1.15f, params[1].presence_penalty = 0.3f,
  params[1].frequency_penalty = 0.1f;
  params[1].seed = 11;
  params[2].temperature = 1.0f, params[2].seed = 12;
  for (bool with_experts : {true, false}) {
    MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> a,
                               MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), with_experts));
    MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> b,
                               MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), with_experts));
    ExpertClient* ec = with_experts ? nullptr : experts.get();
    const std::vector<std::vector<int32_t>> prompts = {{5, 17, 300}, {1, 2, 3, 4, 5, 6, 7}, {400}};
    std::vector<std::unique_ptr<KvSequence>> sa, sb;
    std::vector<Sampler> samplers;
    for (size_t i = 0; i < prompts.size(); ++i) {
      sa.push_back(*a->NewSequence(64));
      sb.push_back(*b->NewSequence(64));
      samplers.emplace_back(params[i]);
    }
    std::vector<std::vector<int32_t>> next = prompts, outputs(prompts.size());
    int sampled = 0;
    for (int step = 0; step < 10; ++step) {
      const int k = step == 4 ? 21 : 5;  // step 4: the host path
      std::vector<SequenceInput> ia, ib;
      std::vector<SampleRequest> samples;
      for (size_t i = 0; i < prompts.size(); ++i) {
        ia.push_back({next[i], sa[i].get()});
        ib.push_back({next[i], sb[i].get()});
        samples.push_back({&params[i], samplers[i].Draw(step), prompts[i], outputs[i]});
      }
      MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> logits, a->Forward(ia, ec));
      MOESH_ASSERT_OK_AND_ASSIGN(SampledTokens g, b->ForwardSample(ib, ec, samples, k));
      ASSERT_EQ(g.ids.size(), prompts.size());
      ASSERT_EQ(g.top_logprobs.size(), prompts.size());
      for (size_t i = 0; i < prompts.size(); ++i) {
        const float* row = logits.data() + i * vocab;
        const int32_t want =
            Sampler::SampleWithDraw(row, vocab, params[i], samples[i].draw, prompts[i], outputs[i]);
        EXPECT_EQ(g.ids[i], want) << "step " << step << " row " << i;
        sampled += i > 0 && want != Argmax(logits, static_cast<int>(i), vocab);
        const std::vector<TokenLogprob> top = Sampler::TopLogprobs(row, vocab, k);
        ASSERT_EQ(g.top_logprobs[i].size(), top.size());
        for (int j = 0; j < k; ++j) {
          EXPECT_EQ(g.top_logprobs[i][j].id, top[j].id);
          EXPECT_NEAR(g.top_logprobs[i][j].logprob, top[j].logprob, 1e-4);
        }
        outputs[i].push_back(g.ids[i]);
        next[i] = {g.ids[i]};
      }
    }
    EXPECT_GT(sampled, 0)
        << "the sampled rows never left the argmax: the test would not see a sampler bug";
    std::vector<SequenceInput> ib;
    for (size_t i = 0; i < prompts.size(); ++i) ib.push_back({next[i], sb[i].get()});
    EXPECT_EQ(b->ForwardSample(ib, ec, {}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

// The sampled token's own log-probability: greedy on the device (the step's
// next_logprobs), sampled through the host; both log_softmax of the raw logits.
// Prompt log-probabilities go through ForwardAllPositions (cuda_prompt_logprobs_test
// compares them with the CPU engine's).
TEST(CudaAttentionBackendTest, SampledTokensOwnLogprob) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(kGoldenV3));
  const int vocab = m.config.vocab_size;
  SamplingParams greedy, sampled;
  greedy.logprobs = sampled.logprobs = true;
  sampled.temperature = 1.3f, sampled.seed = 5;
  const std::vector<int32_t> prompt = {5, 17, 300};
  for (const SamplingParams* p : {&greedy, &sampled}) {
    MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> a,
                               MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), true));
    MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> b,
                               MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), true));
    EXPECT_TRUE(b->has_all_position_logits());
    std::unique_ptr<KvSequence> sa = *a->NewSequence(8), sb = *b->NewSequence(8);
    const SequenceInput ia{prompt, sa.get()}, ib{prompt, sb.get()};
    SampleRequest req{p, 0.37, prompt, {}};
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<float> logits, a->Forward({&ia, 1}, nullptr));
    MOESH_ASSERT_OK_AND_ASSIGN(SampledTokens g, b->ForwardSample({&ib, 1}, nullptr, {&req, 1}, 0));
    EXPECT_NEAR(g.logprobs[0], Sampler::Logprob(logits.data(), vocab, g.ids[0]), 1e-3);
    req.prompt_logprobs = 1;  // the prompt again, after itself
    MOESH_ASSERT_OK_AND_ASSIGN(SampledTokens again,
                               b->ForwardSample({&ib, 1}, nullptr, {&req, 1}, 0));
    ASSERT_EQ(again.prompt_logprobs.size(), 1u);
    EXPECT_EQ(again.prompt_logprobs[0].logprobs.size(), prompt.size() - 1);
    ASSERT_EQ(again.prompt_logprobs[0].top.size(), prompt.size() - 1);
    for (const std::vector<TokenLogprob>& top : again.prompt_logprobs[0].top) {
      ASSERT_EQ(top.size(), 1u);
      EXPECT_LE(top[0].logprob, 0.0f);
    }
  }
}

TEST(CudaAttentionBackendTest, PoolLimitsAndReleases) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(kGoldenV3));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> b,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), true));
  const KvUsage u = b->kv_usage();
  ASSERT_GT(u.total_blocks, 0);
  EXPECT_EQ(u.free_blocks, u.total_blocks);
  EXPECT_EQ(b->NewSequence(m.config.max_position_embeddings + 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<std::unique_ptr<KvSequence>> held;
  absl::Status last;
  while (true) {
    absl::StatusOr<std::unique_ptr<KvSequence>> s =
        b->NewSequence(m.config.max_position_embeddings);
    if (!s.ok()) {
      last = s.status();
      break;
    }
    held.push_back(std::move(*s));
  }
  EXPECT_EQ(last.code(), absl::StatusCode::kResourceExhausted) << last;
  EXPECT_FALSE(held.empty());
  held.clear();
  EXPECT_EQ(b->kv_usage().free_blocks, u.total_blocks);
}

TEST(CudaAttentionBackendTest, GenerateMatchesTheCpuEngine) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(kGoldenV3));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> b,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), true));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> cpu, Model::Load(kGoldenV3));
  SamplingParams sp;
  sp.top_logprobs = 3;
  StopParams stop;
  stop.max_new_tokens = 12;
  stop.ignore_eos = true;
  const std::vector<int32_t> prompt = {5, 17, 300, 42, 9, 100};
  MOESH_ASSERT_OK_AND_ASSIGN(GenerationResult want, Generate(*cpu, prompt, sp, stop));
  MOESH_ASSERT_OK_AND_ASSIGN(GenerationResult got, Generate(b.get(), nullptr, prompt, sp, stop));
  ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size());
  // Teacher forcing is cuda_model_test's; here the first tokens, before any
  // bf16 near-tie could send the two apart, and the logprobs while they agree.
  size_t same = 0;
  while (same < want.output_ids.size() && got.output_ids[same] == want.output_ids[same]) ++same;
  EXPECT_GE(same, 4u) << "the CUDA generate diverged from the CPU engine at token " << same;
  for (size_t i = 0; i < same; ++i) {
    EXPECT_NEAR(got.top_logprobs[i][0].logprob, want.top_logprobs[i][0].logprob, 2e-2)
        << "token " << i;
  }
}

// DeepSeek-V3.2 through the backend, prompt and generation past index_topk
// (the indexer then picks among the causal rows): the first tokens as the CPU
// engine's, and a sequence up to max_model_len accepted.
TEST(CudaAttentionBackendTest, V32BeyondIndexTopkGeneratesAsTheCpuEngine) {
  MOESH_REQUIRE_GPU();
  const std::string dir = testing::GoldenDir("v32");
  MOESH_ASSERT_OK_AND_ASSIGN(Loaded m, OpenChecked(dir));
  const int topk = m.config.indexer.topk;
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<AttentionBackend> b,
                             MakeAttentionBackend(m.config, m.ckpt.get(), Cuda(), true));
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Model> cpu, Model::Load(dir));
  SamplingParams sp;
  sp.top_logprobs = 1;
  StopParams stop;
  stop.ignore_eos = true;
  std::vector<int32_t> prompt;
  for (int i = 0; i < topk + 5; ++i) prompt.push_back(7 + 13 * i);
  stop.max_new_tokens = 12;
  MOESH_ASSERT_OK_AND_ASSIGN(GenerationResult want, Generate(*cpu, prompt, sp, stop));
  MOESH_ASSERT_OK_AND_ASSIGN(GenerationResult got, Generate(b.get(), nullptr, prompt, sp, stop));
  ASSERT_EQ(got.output_ids.size(), want.output_ids.size());
  size_t same = 0;
  while (same < want.output_ids.size() && got.output_ids[same] == want.output_ids[same]) ++same;
  // (The log-probabilities, teacher-forced with near-ties told apart, are
  // cuda_model_test's.)
  EXPECT_GE(same, 4u) << "the CUDA model diverged from the CPU engine at token " << same;
  MOESH_ASSERT_OK_AND_ASSIGN(std::unique_ptr<KvSequence> longest, b->NewSequence(4 * topk));
  EXPECT_GE(longest->capacity(), 4 * topk);
}

}  // namespace
}  // namespace moesh::cuda
