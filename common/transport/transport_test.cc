// Every transport implementation against the same contract: requests reach
// the handler and replies come back intact (small and large, from many
// threads), handler errors keep their code and message, a dead peer is
// UNAVAILABLE.
#include "common/transport/transport.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/dtype.h"
#include "base/status.h"
#include "common/backend/cuda_backends_plugin.h"
#include "common/engine/paged_kv_cache.h"
#include "common/rpc/grpc_util.h"
#include "common/transport/cuda_ipc_transport.h"
#include "common/transport/dispatch_wire.h"
#include "common/transport/grpc_data_plane_service.h"
#include "common/transport/kv_handoff.h"
#include "common/transport/kv_wire.h"
#include "common/transport/nccl_transport.h"
#include "common/transport/remote_expert_client.h"
#include "common/transport/ucx_transport.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

// Doubles every float of the hidden states (host dispatches; device ones
// are refused); records KV pushes.
class FakeHandlers : public DispatchHandler, public KvHandler {
 public:
  absl::Status Dispatch(const MoeDispatch& d, float* out) override {
    RETURN_IF_ERROR(CheckDispatchMemory(d, MemoryKinds(), "the fake handler"));
    if (d.layer < 0) return absl::InvalidArgumentError(absl::StrCat("bad layer ", d.layer));
    for (size_t i = 0; i < static_cast<size_t>(d.num_tokens) * d.hidden; ++i)
      out[i] = 2 * d.hidden_f32()[i];
    return absl::OkStatus();
  }
  absl::Status PushKv(const KvTransfer& r) override {
    absl::MutexLock lock(&mu_);
    pushed_.push_back(r.request_id + ":" + std::to_string(r.row_bytes()));
    return absl::OkStatus();
  }
  std::vector<std::string> pushed() {
    absl::MutexLock lock(&mu_);
    return pushed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> pushed_;
};

// A running server of one transport kind.
class Server {
 public:
  virtual ~Server() = default;
  virtual std::string address() const = 0;
};

class GrpcServer : public Server {
 public:
  explicit GrpcServer(FakeHandlers* h) : service_(h, h) {
    server_ = *StartGrpcServer("127.0.0.1:0", {&service_});
  }
  ~GrpcServer() override { server_.server->Shutdown(); }
  std::string address() const override { return absl::StrCat("127.0.0.1:", server_.port); }

 private:
  GrpcDataPlaneService service_;
  RunningServer server_;
};

// A transport's own listener (ucx, nccl, cuda_ipc), from its Start.
class ListenerServer : public Server {
 public:
  template <typename S>
  explicit ListenerServer(absl::StatusOr<std::unique_ptr<S>> s) {
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) server_ = std::move(*s);
  }
  std::string address() const override {
    return absl::StrCat("127.0.0.1:", server_ ? server_->port() : 0);
  }

 private:
  std::unique_ptr<DataPlaneServer> server_;
};

// GPUs this process can see, through the CUDA plugin (0 without one).
int CudaDevices() {
  absl::StatusOr<const CudaBackendsTable*> cuda = CudaBackends();
  if (!cuda.ok()) return 0;
  absl::StatusOr<int> n = (*cuda)->device_count();
  return n.ok() ? *n : 0;
}

class InprocServer : public Server {
 public:
  explicit InprocServer(FakeHandlers* h) : address_(absl::StrCat("inproc-", ++count_)) {
    EXPECT_TRUE(BindInproc(address_, h, h).ok());
  }
  ~InprocServer() override { UnbindInproc(address_); }
  std::string address() const override { return address_; }

 private:
  static inline int count_ = 0;
  const std::string address_;
};

struct Kind {
  const char* name;
  const char* transport;
  const char* ucx_tls;  // UCX_TLS for ucx kinds
};

class TransportTest : public ::testing::TestWithParam<Kind> {
 protected:
  void SetUp() override {
    setenv("UCX_NET_DEVICES", "lo", 1);
    if (GetParam().ucx_tls) setenv("UCX_TLS", GetParam().ucx_tls, 1);
    const bool nccl = std::string(GetParam().transport) == "nccl";
    if (nccl) {
      const int gpus = CudaDevices();
      if (gpus < 2) GTEST_SKIP() << "the nccl transport joins two GPUs; this machine has " << gpus;
      setenv("NCCL_SOCKET_IFNAME", "lo", 1);
      setenv("NCCL_NVLS_ENABLE", "0", 1);
    }
    server_ = MakeServer();
    if (nccl) {  // short deadlines, so a dead peer fails the test's calls quickly
      NcclTransportOptions o;
      o.device = 0;
      o.connect_timeout = absl::Seconds(20);
      o.call_timeout = absl::Seconds(5);
      transport_ = MakeNcclTransport(o);
    } else {
      absl::StatusOr<std::unique_ptr<Transport>> t = MakeTransport(GetParam().transport);
      ASSERT_TRUE(t.ok()) << t.status();
      transport_ = std::move(*t);
    }
    absl::StatusOr<std::unique_ptr<DataChannel>> ch = transport_->Connect(server_->address());
    ASSERT_TRUE(ch.ok()) << ch.status();
    channel_ = std::move(*ch);
  }
  std::unique_ptr<Server> MakeServer() {
    const std::string t = GetParam().transport;
    if (t == "grpc") return std::make_unique<GrpcServer>(&handlers_);
    FakeHandlers* const h = &handlers_;
    if (t == "ucx") {
      return std::make_unique<ListenerServer>(UcxDataPlaneServer::Start("127.0.0.1:0", h, h));
    }
    if (t == "nccl") {  // on GPU 1 (the client is on GPU 0)
      return std::make_unique<ListenerServer>(NcclDataPlaneServer::Start("127.0.0.1:0", 1, h, h));
    }
    if (t == "cuda_ipc") {  // host calls need no GPU
      return std::make_unique<ListenerServer>(
          CudaIpcDataPlaneServer::Start("127.0.0.1:0", 0, h, h));
    }
    return std::make_unique<InprocServer>(&handlers_);
  }
  // A dispatch of `tokens` x `hidden` floats counting up from `base`, top-1.
  struct Request {
    Request(int tokens, int hidden, float base)
        : h(static_cast<size_t>(tokens) * hidden), ids(tokens, 0), weights(tokens, 1.0f) {
      for (size_t i = 0; i < h.size(); ++i) h[i] = base + static_cast<float>(i);
      d.layer = 1, d.num_tokens = tokens, d.hidden = hidden, d.top_k = 1;
      d.hidden_states = h.data(), d.topk_ids = ids.data(), d.topk_weights = weights.data();
    }
    Request(const Request&) = delete;
    std::vector<float> h;
    std::vector<int32_t> ids;
    std::vector<float> weights;
    MoeDispatch d;
  };
  // Dispatches `req` (its answer to be the hidden states doubled).
  absl::Status Dispatch(DataChannel& channel, const Request& req) {
    std::vector<float> out(req.h.size(), -1.0f);
    RETURN_IF_ERROR(channel.Dispatch(req.d, out.data()));
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] != 2 * req.h[i])
        return absl::InternalError(absl::StrCat("float ", i, ": ", out[i], " != 2 * ", req.h[i]));
    }
    return absl::OkStatus();
  }

  FakeHandlers handlers_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<DataChannel> channel_;
};

TEST_P(TransportTest, DispatchRoundTripsSmallAndLarge) {
  using Shape = std::pair<int, int>;  // tokens, hidden: up to 16 MiB
  for (const auto& [tokens, hidden] :
       {Shape(0, 8), Shape(1, 1), Shape(10, 100), Shape(4096, 1024)}) {
    const Request req(tokens, hidden, 0.5f);
    const absl::Status s = Dispatch(*channel_, req);
    ASSERT_TRUE(s.ok()) << tokens << " x " << hidden << ": " << s;
  }
}

// The narrower encodings (--dispatch_dtype) through each transport's own
// message path: the answer within bf16's rounding of the doubled input (and
// fp8's of the input; in process the floats pass as they are).
TEST_P(TransportTest, NarrowEncodingsTravel) {
  for (const char* dtype : {"bf16", "fp8"}) {
    Request req(5, 300, 0.5f);  // groups of 128, 128, 44 a token for fp8
    for (size_t i = 0; i < req.h.size(); ++i) req.h[i] = std::sin(0.1f * static_cast<float>(i));
    req.d.wire = *ParseDispatchDType(dtype);
    std::vector<float> out(req.h.size(), -1.0f);
    ASSERT_TRUE(channel_->Dispatch(req.d, out.data()).ok()) << dtype;
    // |sin| <= 1: fp8 within 2^-4 of a group's amax, then doubled and rounded to bf16.
    const float input = std::string(dtype) == "fp8" ? 1.0f / 16 : 1.0f / 256;
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_NEAR(out[i], 2 * req.h[i], 2 * input + 3.0f / 256) << dtype << " " << i;
    }
  }
}

TEST_P(TransportTest, PushKvArrives) {
  KvTransfer kv;  // 3 MiB of float32 rows
  kv.request_id = "r1";
  kv.num_layers = 3, kv.num_tokens = 1024, kv.row_width = 256;
  kv.rows.assign(size_t{3} * 1024 * 256, 1.5f);
  ASSERT_TRUE(channel_->PushKv(kv).ok());
  EXPECT_EQ(handlers_.pushed(), std::vector<std::string>{"r1:3145728"});
}

TEST_P(TransportTest, HandlerErrorsKeepCodeAndMessage) {
  Request req(4, 1, 1);
  req.d.layer = -7;
  const absl::Status s = Dispatch(*channel_, req);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bad layer -7"), std::string::npos) << s;
}

TEST_P(TransportTest, ConcurrentCallsGetTheirOwnReplies) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        const Request req(1 + (i % 7) * 16, 64, static_cast<float>(t * 1000 + i));
        const absl::Status s = Dispatch(*channel_, req);
        ASSERT_TRUE(s.ok()) << s;
      }
    });
  }
  for (auto& th : threads) th.join();
}

TEST_P(TransportTest, DeadPeerIsUnavailable) {
  const std::string address = server_->address();
  server_.reset();
  // Connecting may fail at once (nccl: the rendezvous RPC) or the first call.
  absl::StatusOr<std::unique_ptr<DataChannel>> ch = transport_->Connect(address);
  const Request req(2, 4, 1);
  const absl::Status s = ch.ok() ? Dispatch(**ch, req) : ch.status();
  EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
              s.code() == absl::StatusCode::kDeadlineExceeded)
      << s;
  // The old channel too.
  EXPECT_FALSE(Dispatch(*channel_, req).ok());
}

// cuda_ipc's device path: the channel reports the client's device; without
// a GPU (or the CUDA plugin) a device dispatch says so, and a handler that
// serves no device memory answers UNIMPLEMENTED where there is one.
TEST(CudaIpcTransportTest, DeviceDispatchNeedsAGpuAndAHandler) {
  FakeHandlers h;
  ListenerServer server(CudaIpcDataPlaneServer::Start("127.0.0.1:0", 0, &h, &h));
  absl::StatusOr<std::unique_ptr<Transport>> t = MakeTransport("cuda_ipc", 0);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<std::unique_ptr<DataChannel>> ch = (*t)->Connect(server.address());
  ASSERT_TRUE(ch.ok()) << ch.status();
  EXPECT_EQ((*ch)->memory_kinds().device, 0);
  EXPECT_EQ((*ch)->Collect(nullptr, false).code(), absl::StatusCode::kFailedPrecondition);
  MoeDispatch d;
  d.layer = 1, d.num_tokens = 0, d.hidden = 64, d.top_k = 2;
  d.memory = DispatchMemory::CudaDevice(0);
  const absl::Status posted = (*ch)->Post(d);
  if (CudaDevices() == 0) {
    EXPECT_EQ(posted.code(), absl::StatusCode::kFailedPrecondition) << posted;
    return;
  }
  ASSERT_TRUE(posted.ok()) << posted;
  EXPECT_EQ((*ch)->Collect(nullptr, false).code(), absl::StatusCode::kUnimplemented);
}

TEST(CudaIpcTransportTest, ConnectToNothingIsUnavailable) {
  absl::StatusOr<std::unique_ptr<Transport>> t = MakeTransport("cuda_ipc", 0);
  ASSERT_TRUE(t.ok()) << t.status();
  GrpcServer grpc(nullptr);  // a gRPC server without the IpcDataPlane service
  absl::StatusOr<std::unique_ptr<DataChannel>> ch = (*t)->Connect(grpc.address());
  ASSERT_FALSE(ch.ok());
  EXPECT_EQ(ch.status().code(), absl::StatusCode::kUnimplemented) << ch.status();
  ch = (*t)->Connect("127.0.0.1:1");
  ASSERT_FALSE(ch.ok());
  EXPECT_EQ(ch.status().code(), absl::StatusCode::kUnavailable) << ch.status();
}

// Expert workers whose channels break for good when the worker dies (as
// cuda_ipc's and nccl's do): a restarted worker is only reached through a
// new channel.
class RestartingWorkers : public Transport {
 public:
  struct Worker {
    bool up = true;
    int generation = 0;  // bumped by every restart
    int connects = 0, calls = 0;
    bool corrupt = false;  // answers 4 bytes
  };
  absl::string_view name() const override { return "restarting"; }
  absl::StatusOr<std::unique_ptr<DataChannel>> Connect(const std::string& address) override {
    absl::MutexLock lock(&mu_);
    Worker& w = workers_[address];
    if (!w.up) return absl::UnavailableError(address + " is down");
    ++w.connects;
    return std::unique_ptr<DataChannel>(new Channel(this, address, w.generation));
  }
  void Kill(const std::string& a) {
    absl::MutexLock lock(&mu_);
    workers_[a].up = false;
  }
  void Corrupt(const std::string& a) {
    absl::MutexLock lock(&mu_);
    workers_[a].corrupt = true;
  }
  void Restart(const std::string& a) {
    absl::MutexLock lock(&mu_);
    workers_[a].up = true;
    ++workers_[a].generation;
  }
  Worker Get(const std::string& a) {
    absl::MutexLock lock(&mu_);
    return workers_[a];
  }

 private:
  class Channel : public DataChannel {
   public:
    Channel(RestartingWorkers* t, std::string address, int generation)
        : t_(t), address_(std::move(address)), generation_(generation) {}
    absl::Status Dispatch(const MoeDispatch& d, float* out) override {
      absl::MutexLock lock(&t_->mu_);
      Worker& w = t_->workers_[address_];
      if (!w.up || w.generation != generation_)
        return absl::UnavailableError(address_ + ": channel broken");
      ++w.calls;
      v1::DispatchResponse answer;  // as a worker answering over the wire would
      answer.set_output(std::string(
          w.corrupt ? 4 : static_cast<size_t>(d.num_tokens) * d.hidden * sizeof(float), '\0'));
      return DecodeDispatchResponse(answer, d, address_, out);
    }
    absl::Status PushKv(const KvTransfer&) override { return absl::OkStatus(); }
    const std::string& peer() const override { return address_; }

   private:
    RestartingWorkers* const t_;
    const std::string address_;
    const int generation_;
  };
  absl::Mutex mu_;
  std::map<std::string, Worker> workers_ ABSL_GUARDED_BY(mu_);
};

// One token (hidden 4) for experts 0 and 1 with equal weights, layer 1.
struct OneToken {
  std::vector<float> x = std::vector<float>(4, 1.0f), out = std::vector<float>(4);
  std::vector<int32_t> ids = {0, 1};
  std::vector<float> w = {0.5f, 0.5f};
  MoeDispatch dispatch() const {
    MoeDispatch d;
    d.layer = 1, d.num_tokens = 1, d.hidden = 4, d.top_k = 2;
    d.hidden_states = x.data(), d.topk_ids = ids.data(), d.topk_weights = w.data();
    return d;
  }
};

TEST(RemoteExpertClientTest, RoutesAroundADeadWorkerAndReconnectsWhenItIsBack) {
  RestartingWorkers t;
  auto client = RemoteExpertClient::Create(&t, {{"a", {0, 1}}, {"b", {0, 1}}}, 2,
                                           std::chrono::milliseconds(50));
  ASSERT_TRUE(client.ok()) << client.status();
  OneToken one;
  const MoeDispatch d = one.dispatch();
  std::vector<float>& out = one.out;
  // Both experts on both workers: they take turns, so each worker serves one
  // expert of every dispatch.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*client)->Run(d, out.data()).ok());
  EXPECT_EQ(t.Get("a").calls, 4);
  EXPECT_EQ(t.Get("b").calls, 4);
  t.Kill("a");
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE((*client)->Run(d, out.data()).ok());  // the replica takes over
  EXPECT_GE(t.Get("b").calls, 6);                     // its share of the failed attempt too
  t.Restart("a");
  absl::SleepFor(absl::Milliseconds(80));  // past retry_after
  ASSERT_TRUE((*client)->Run(d, out.data()).ok());
  EXPECT_EQ(t.Get("a").calls, 5) << "the restarted worker is not reached";
  EXPECT_EQ(t.Get("a").connects, 2);  // through a new channel
  // Every host gone: UNAVAILABLE naming an expert.
  t.Kill("a");
  t.Kill("b");
  const absl::Status s = (*client)->Run(d, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("expert"), std::string::npos) << s;
}

// A worker whose answers have the wrong size is marked down like a dead one
// (its replica takes over); with no replica the step is DATA_LOSS naming it.
TEST(RemoteExpertClientTest, AWorkerAnsweringTheWrongSizeIsRoutedAround) {
  RestartingWorkers t;
  auto client = RemoteExpertClient::Create(&t, {{"a", {0, 1}}, {"b", {0, 1}}}, 2);
  ASSERT_TRUE(client.ok()) << client.status();
  OneToken one;
  const MoeDispatch d = one.dispatch();
  std::vector<float>& out = one.out;
  t.Corrupt("a");
  ASSERT_TRUE((*client)->Run(d, out.data()).ok());
  ASSERT_TRUE((*client)->Run(d, out.data()).ok());
  EXPECT_EQ(t.Get("a").calls, 1) << "a worker answering garbage is not routed around";
  EXPECT_EQ(t.Get("b").calls, 3);

  RestartingWorkers alone;
  auto only = RemoteExpertClient::Create(&alone, {{"a", {0, 1}}}, 2);
  ASSERT_TRUE(only.ok()) << only.status();
  alone.Corrupt("a");
  const absl::Status s = (*only)->Run(d, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_EQ(s.message(), "expert worker a returned 4 bytes, expected 16");
}

// The one conversion of a dispatch to and from the wire (dispatch_wire.h).
TEST(DispatchWireTest, RequestAndResponseRoundTrip) {
  const int tokens = 3, hidden = 5, top_k = 2;
  std::vector<float> h(tokens * hidden), weights(tokens * top_k);
  std::vector<int32_t> ids(tokens * top_k);
  for (size_t i = 0; i < h.size(); ++i) h[i] = 0.25f * static_cast<float>(i) - 1.0f;
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i == 1 ? -1 : static_cast<int32_t>(i * 3);
  for (size_t i = 0; i < weights.size(); ++i) weights[i] = 1.0f / static_cast<float>(i + 1);
  MoeDispatch d;
  d.layer = 7, d.num_tokens = tokens, d.hidden = hidden, d.top_k = top_k;
  d.hidden_states = h.data(), d.topk_ids = ids.data(), d.topk_weights = weights.data();
  v1::DispatchRequest request;
  EncodeDispatchRequest(d, &request);
  EXPECT_EQ(request.hidden_states().size(), h.size() * sizeof(float));
  absl::StatusOr<DecodedDispatch> decoded = DecodeDispatchRequest(request);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const MoeDispatch* got = &decoded->dispatch;
  EXPECT_EQ(got->layer, 7);
  EXPECT_EQ(got->num_tokens, tokens);
  EXPECT_EQ(got->hidden, hidden);
  EXPECT_EQ(got->top_k, top_k);
  EXPECT_TRUE(decoded->widened.empty()) << "fp32 is read from the message itself";
  EXPECT_EQ(std::vector<float>(got->hidden_f32(), got->hidden_f32() + h.size()), h);
  EXPECT_EQ(std::vector<int32_t>(got->topk_ids, got->topk_ids + ids.size()), ids);
  EXPECT_EQ(std::vector<float>(got->topk_weights, got->topk_weights + weights.size()), weights);

  // The answer: the handler's output in, the caller's buffer out.
  FakeHandlers handler;
  v1::DispatchResponse response;
  ASSERT_TRUE(ServeDispatch(handler, request, &response).ok());
  std::vector<float> out(h.size(), -1.0f);
  ASSERT_TRUE(DecodeDispatchResponse(response, d, "w", out.data()).ok());
  for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(out[i], 2 * h[i]) << i;
  EncodeDispatchResponse(d, h.data(), &response);
  ASSERT_TRUE(DecodeDispatchResponse(response, d, "w", out.data()).ok());
  EXPECT_EQ(out, h);
  // An answer of the wrong size is DATA_LOSS naming the worker; out untouched.
  response.mutable_output()->resize(8);
  std::fill(out.begin(), out.end(), -1.0f);
  const absl::Status lost = DecodeDispatchResponse(response, d, "10.0.0.1:9", out.data());
  EXPECT_EQ(lost.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(lost.message(), "expert worker 10.0.0.1:9 returned 8 bytes, expected 60");
  EXPECT_EQ(out, std::vector<float>(h.size(), -1.0f));
  // No tokens: an empty message and an empty answer.
  d.num_tokens = 0;
  EncodeDispatchRequest(d, &request);
  EXPECT_TRUE(request.hidden_states().empty());
  EXPECT_EQ(request.topk_ids_size(), 0);
  ASSERT_TRUE(DecodeDispatchRequest(request).ok());
  ASSERT_TRUE(ServeDispatch(handler, request, &response).ok());
  EXPECT_TRUE(response.output().empty());
}

TEST(DispatchWireTest, MalformedRequestsAreInvalidArgument) {
  MoeDispatch d;
  std::vector<float> h(2 * 4, 1.0f), weights(2 * 2, 0.5f);
  std::vector<int32_t> ids(2 * 2, 0);
  d.layer = 1, d.num_tokens = 2, d.hidden = 4, d.top_k = 2;
  d.hidden_states = h.data(), d.topk_ids = ids.data(), d.topk_weights = weights.data();
  v1::DispatchRequest good;
  EncodeDispatchRequest(d, &good);
  ASSERT_TRUE(DecodeDispatchRequest(good).ok());
  struct Case {
    std::function<void(v1::DispatchRequest*)> spoil;
    std::string message;
  };
  const Case cases[] = {
      {[](v1::DispatchRequest* r) { r->set_num_tokens(-1); },
       "dispatch with bad dimensions (num_tokens -1, hidden 4, top_k 2)"},
      {[](v1::DispatchRequest* r) { r->set_top_k(0); },
       "dispatch with bad dimensions (num_tokens 2, hidden 4, top_k 0)"},
      {[](v1::DispatchRequest* r) { r->set_hidden(0); },
       "dispatch with bad dimensions (num_tokens 2, hidden 0, top_k 2)"},
      {[](v1::DispatchRequest* r) { r->set_num_tokens(3); },
       "dispatch hidden_states holds 32 bytes, expected 48 (fp32)"},
      {[](v1::DispatchRequest* r) { r->mutable_hidden_states()->resize(31); },
       "dispatch hidden_states holds 31 bytes, expected 32 (fp32)"},
      {[](v1::DispatchRequest* r) { r->add_topk_ids(0); },
       "dispatch topk_ids/topk_weights do not match num_tokens * top_k"},
      {[](v1::DispatchRequest* r) { r->mutable_topk_weights()->RemoveLast(); },
       "dispatch topk_ids/topk_weights do not match num_tokens * top_k"},
  };
  FakeHandlers handler;
  for (const Case& c : cases) {
    v1::DispatchRequest r = good;
    c.spoil(&r);
    const absl::Status s = DecodeDispatchRequest(r).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(s.message(), c.message);
    v1::DispatchResponse response;
    EXPECT_EQ(ServeDispatch(handler, r, &response).code(), absl::StatusCode::kInvalidArgument);
  }
}

// A cache whose values are bf16 (as a GPU's): the handoff sends half the
// bytes and the receiver gets the same floats; a float32 cache goes as is.
class Bf16Cache : public SequenceKvCache {
 public:
  using SequenceKvCache::SequenceKvCache;
  bool bf16_rows() const override { return true; }
};

TEST(KvHandoffTest, Bf16CachesTravelExactlyInHalfTheBytes) {
  const int layers = 3, width = 10, tokens = 7;
  Bf16Cache gpu_like(layers, width);
  SequenceKvCache host(layers, width);
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 3.0f);
  for (int l = 0; l < layers; ++l) {
    std::vector<float> rows(tokens * width);
    for (float& v : rows) v = Bf16ToF32(F32ToBf16(n(rng)));
    gpu_like.AppendRows(l, rows.data(), tokens);
    for (float& v : rows) v = n(rng);  // not bf16-representable
    host.AppendRows(l, rows.data(), tokens);
  }
  const KvTransfer half = *SerializeKv("r1", gpu_like, layers);
  const KvTransfer full = *SerializeKv("r2", host, layers);
  EXPECT_TRUE(half.rows_bf16);
  EXPECT_FALSE(full.rows_bf16);
  EXPECT_TRUE(half.rows.empty());
  EXPECT_TRUE(full.bf16_rows.empty());
  EXPECT_EQ(half.bf16_rows.size(), size_t{layers} * tokens * width);
  EXPECT_EQ(full.rows.size(), size_t{layers} * tokens * width);
  v1::PushKvRequest half_msg, full_msg;  // on the wire: half the bytes
  EncodePushKv(half, &half_msg);
  EncodePushKv(full, &full_msg);
  EXPECT_TRUE(half_msg.rows_bf16());
  EXPECT_FALSE(full_msg.rows_bf16());
  EXPECT_EQ(half_msg.rows().size(), size_t{layers} * tokens * width * 2);
  EXPECT_EQ(full_msg.rows().size(), size_t{layers} * tokens * width * 4);
  using Case = std::pair<const v1::PushKvRequest*, const SequenceKvCache*>;
  for (const auto& [msg, from] : {Case(&half_msg, &gpu_like), Case(&full_msg, &host)}) {
    SequenceKvCache got(layers, width);
    const absl::StatusOr<KvTransfer> t = DecodePushKv(*msg);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(DeserializeKv(*t, layers, &got).ok());
    ASSERT_EQ(got.length(), tokens);
    for (int l = 0; l < layers; ++l) {
      for (int i = 0; i < tokens * width; ++i)
        ASSERT_EQ(got.rows(l)[i], from->rows(l)[i]) << l << " " << i;
    }
  }
  // A truncated transfer is refused.
  KvTransfer bad = half;
  bad.bf16_rows.pop_back();
  SequenceKvCache got(layers, width);
  EXPECT_EQ(DeserializeKv(bad, layers, &got).code(), absl::StatusCode::kInvalidArgument);
  // Host caches have no device memory to hand over, and take none: clear errors.
  EXPECT_EQ(SerializeKv("r3", host, layers, KvHandoff::kDevice).status().code(),
            absl::StatusCode::kUnimplemented);
  KvTransfer dev;
  dev.request_id = "r4", dev.num_layers = layers, dev.num_tokens = tokens, dev.row_width = width;
  dev.device.emplace();
  dev.device->block_size = 64;
  dev.device->blocks = {3};
  EXPECT_EQ(DeserializeKv(dev, layers, &got).code(), absl::StatusCode::kUnimplemented);
  dev.device->blocks.clear();  // 0 blocks cannot hold 7 tokens
  EXPECT_EQ(DeserializeKv(dev, layers, &got).code(), absl::StatusCode::kInvalidArgument);
}

// The host handoff leaves out the rows the receiving reservation holds from
// its prefix cache (first_row); rows starting past what it holds are
// FAILED_PRECONDITION (the sender resends them all).
TEST(KvHandoffTest, RowsFromWhatTheReceiverHolds) {
  const int layers = 2, width = 3, bs = 4;
  KvBlockPool pool(layers, width, bs, 16, /*prefix_cache=*/true);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 11; ++i) prompt.push_back(100 + i);
  std::vector<std::vector<float>> rows(layers);
  for (int l = 0; l < layers; ++l) {
    for (int i = 0; i < 11 * width; ++i) rows[l].push_back(static_cast<float>(l * 1000 + i));
  }
  {  // an earlier request published the first two blocks
    std::unique_ptr<PagedKvSequence> first = *pool.Allocate(11, prompt);
    for (int l = 0; l < layers; ++l) first->AppendRows(l, rows[l].data(), 11);
    first->PublishPrefix(prompt);
  }
  SequenceKvCache sender(layers, width);
  for (int l = 0; l < layers; ++l) sender.AppendRows(l, rows[l].data(), 11);
  std::unique_ptr<PagedKvSequence> held = *pool.Allocate(11, prompt);
  ASSERT_EQ(held->cached_tokens(), 8);
  const KvTransfer from8 = *SerializeKv("r", sender, layers, KvHandoff::kHost, 8);
  EXPECT_EQ(from8.first_row, 8);
  EXPECT_EQ(from8.rows.size(), size_t{layers} * 3 * width);
  ASSERT_TRUE(DeserializeKv(from8, layers, held.get()).ok());
  std::vector<float> scratch;
  for (int l = 0; l < layers; ++l) {
    const float* got = held->Rows(l, &scratch);
    EXPECT_TRUE(std::equal(got, got + 11 * width, rows[l].data())) << "layer " << l;
  }
  // A reservation holding 4 tokens only cannot take rows from token 8.
  std::vector<int32_t> other = prompt;
  other[5] = 7;
  std::unique_ptr<PagedKvSequence> less = *pool.Allocate(11, other);
  ASSERT_EQ(less->cached_tokens(), 4);
  EXPECT_EQ(DeserializeKv(from8, layers, less.get()).code(), absl::StatusCode::kFailedPrecondition);
  const KvTransfer all = *SerializeKv("r", sender, layers, KvHandoff::kHost, 0);
  EXPECT_TRUE(DeserializeKv(all, layers, less.get()).ok());
  EXPECT_EQ(less->length(), 11);
}

// KvTransfer <-> PushKvRequest: every field round-trips; a malformed message
// is INVALID_ARGUMENT with the message the decode side has always given, and
// never reaches the handler.
class CountingKv : public KvHandler {
 public:
  absl::Status PushKv(const KvTransfer& t) override {
    ++calls;
    last = t;
    return answer;
  }
  int calls = 0;
  KvTransfer last;
  absl::Status answer = absl::OkStatus();
};

TEST(KvWireTest, RoundTrips) {
  KvTransfer f32;
  f32.request_id = "a", f32.num_layers = 2, f32.num_tokens = 3, f32.row_width = 4;
  for (int i = 0; i < 24; ++i) f32.rows.push_back(0.25f * i - 1);
  f32.first_token = 41, f32.queue_seconds = 0.125;
  f32.first_logprobs = {{41, -0.5f}, {3, -1.25f}};
  KvTransfer bf16 = f32;
  bf16.request_id = "b", bf16.rows_bf16 = true, bf16.rows.clear();
  for (int i = 0; i < 24; ++i) bf16.bf16_rows.push_back(F32ToBf16(0.5f * i));
  KvTransfer dev;
  dev.request_id = "c", dev.num_layers = 2, dev.num_tokens = 130, dev.row_width = 4;
  dev.device = DeviceKvBlocks{std::string(64, '\x01'), 1, 16, 64, {5, 0, 9}, "sender-7", 656};
  for (const KvTransfer* t : {&f32, &bf16, &dev}) {
    v1::PushKvRequest msg;
    EncodePushKv(*t, &msg);
    EXPECT_EQ(msg.has_device(), t->device.has_value());
    const absl::StatusOr<KvTransfer> back = DecodePushKv(msg);
    ASSERT_TRUE(back.ok()) << t->request_id << ": " << back.status();
    EXPECT_EQ(back->request_id, t->request_id);
    EXPECT_EQ(back->num_layers, t->num_layers);
    EXPECT_EQ(back->num_tokens, t->num_tokens);
    EXPECT_EQ(back->row_width, t->row_width);
    EXPECT_EQ(back->rows_bf16, t->rows_bf16);
    EXPECT_EQ(back->rows, t->rows);
    EXPECT_EQ(back->bf16_rows, t->bf16_rows);
    EXPECT_EQ(back->first_token, t->first_token);
    EXPECT_EQ(back->queue_seconds, t->queue_seconds);
    ASSERT_EQ(back->first_logprobs.size(), t->first_logprobs.size());
    for (size_t i = 0; i < t->first_logprobs.size(); ++i) {
      EXPECT_EQ(back->first_logprobs[i].id, t->first_logprobs[i].id);
      EXPECT_EQ(back->first_logprobs[i].logprob, t->first_logprobs[i].logprob);
    }
    ASSERT_EQ(back->device.has_value(), t->device.has_value());
    if (t->device.has_value()) {
      EXPECT_EQ(back->device->pool_handle, t->device->pool_handle);
      EXPECT_EQ(back->device->device, t->device->device);
      EXPECT_EQ(back->device->num_blocks, t->device->num_blocks);
      EXPECT_EQ(back->device->block_size, t->device->block_size);
      EXPECT_EQ(back->device->blocks, t->device->blocks);
      EXPECT_EQ(back->device->sender, t->device->sender);
      EXPECT_EQ(back->device->row_bytes, t->device->row_bytes);
    }
    CountingKv h;
    ASSERT_TRUE(ServePushKv(h, msg).ok());
    EXPECT_EQ(h.calls, 1);
    EXPECT_EQ(h.last.request_id, t->request_id);
    h.answer = absl::ResourceExhaustedError("full");  // the handler's error as is
    const absl::Status s = ServePushKv(h, msg);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_EQ(s.message(), "full");
  }
}

TEST(KvWireTest, MalformedMessagesAreInvalidArgument) {
  v1::PushKvRequest host;
  host.set_request_id("r"), host.set_num_layers(2), host.set_num_tokens(3), host.set_row_width(4);
  host.set_rows(std::string(2 * 3 * 4 * sizeof(float), '\0'));
  ASSERT_TRUE(DecodePushKv(host).ok());
  v1::PushKvRequest dev = host;
  dev.clear_rows();
  dev.mutable_device()->set_block_size(2);
  dev.mutable_device()->add_blocks(0), dev.mutable_device()->add_blocks(1);
  ASSERT_TRUE(DecodePushKv(dev).ok());
  using Case = std::pair<v1::PushKvRequest, std::string>;
  std::vector<Case> cases;
  cases.emplace_back(host, "KV for r: 95 bytes do not hold 3 tokens");
  cases.back().first.mutable_rows()->pop_back();  // not a whole number of floats
  cases.emplace_back(host, "KV for r: 92 bytes do not hold 3 tokens");
  cases.back().first.mutable_rows()->resize(92);
  cases.emplace_back(host, "KV for r: 96 bytes do not hold 3 tokens");
  cases.back().first.set_rows_bf16(true);  // as many bytes, twice the values
  cases.emplace_back(host, "KV for r: 96 bytes do not hold -1 tokens");
  cases.back().first.set_num_tokens(-1);
  cases.emplace_back(host, "KV for r: 96 bytes do not hold 3 tokens");
  cases.back().first.set_row_width(-4);
  // Rows from token 1 on: 2 of the 3 tokens' rows; more or a row outside is malformed.
  v1::PushKvRequest tail = host;
  tail.set_first_row(1);
  tail.mutable_rows()->resize(2 * 2 * 4 * sizeof(float));
  absl::StatusOr<KvTransfer> from1 = DecodePushKv(tail);
  ASSERT_TRUE(from1.ok()) << from1.status();
  EXPECT_EQ(from1->first_row, 1);
  cases.emplace_back(tail, "KV for r: 96 bytes do not hold tokens 1 to 3");
  cases.back().first.set_rows(host.rows());
  cases.emplace_back(tail, "KV for r: 64 bytes do not hold tokens 4 to 3");
  cases.back().first.set_first_row(4);
  cases.emplace_back(tail, "KV for r: 64 bytes do not hold tokens -1 to 3");
  cases.back().first.set_first_row(-1);
  cases.emplace_back(dev, "KV for r: 2 device blocks of 2 do not hold 3 tokens (or rows sent too)");
  cases.back().first.set_first_row(1);  // device copies start at row 0
  cases.emplace_back(dev, "KV for r: 1 device blocks of 2 do not hold 3 tokens (or rows sent too)");
  cases.back().first.mutable_device()->mutable_blocks()->RemoveLast();
  cases.emplace_back(dev, "KV for r: 2 device blocks of 0 do not hold 3 tokens (or rows sent too)");
  cases.back().first.mutable_device()->set_block_size(0);
  cases.emplace_back(dev, "KV for r: 2 device blocks of 2 do not hold 3 tokens (or rows sent too)");
  cases.back().first.set_rows("x");
  cases.emplace_back(dev,
                     "KV for r: 2 device blocks of 2 do not hold -3 tokens (or rows sent too)");
  cases.back().first.set_num_tokens(-3);
  for (const auto& [msg, message] : cases) {
    const absl::StatusOr<KvTransfer> t = DecodePushKv(msg);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_EQ(t.status().message(), message);
    CountingKv h;
    EXPECT_EQ(ServePushKv(h, msg).code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_EQ(h.calls, 0) << message;
  }
}

TEST(TransportNamesTest, UnknownTransportIsInvalidArgument) {
  EXPECT_EQ(MakeTransport("carrier-pigeon").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TransportNamesTest, NcclWithoutTwoGpusSaysWhy) {
  if (CudaDevices() >= 2)
    GTEST_SKIP() << "two GPUs here: the nccl kind of TransportTest runs instead";
  // The server needs the CUDA plugin and a GPU; without them it says so
  // (FAILED_PRECONDITION), and so does a client's connect.
  FakeHandlers h;
  absl::StatusOr<std::unique_ptr<NcclDataPlaneServer>> s =
      NcclDataPlaneServer::Start("127.0.0.1:0", 0, &h, &h);
  if (CudaDevices() == 0 && !s.ok()) {
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << s.status();
  }
  GrpcServer grpc(&h);  // no NcclDataPlane service there
  absl::StatusOr<std::unique_ptr<Transport>> t = MakeTransport("nccl");
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<std::unique_ptr<DataChannel>> ch = (*t)->Connect(grpc.address());
  ASSERT_FALSE(ch.ok());
  EXPECT_TRUE(ch.status().code() == absl::StatusCode::kFailedPrecondition ||
              ch.status().code() == absl::StatusCode::kUnimplemented)
      << ch.status();
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, TransportTest,
    ::testing::Values(Kind{"inproc", "inproc", nullptr}, Kind{"grpc", "grpc", nullptr},
                      Kind{"ucx_tcp", "ucx", "tcp"}, Kind{"ucx_shm", "ucx", "shm,tcp"},
                      Kind{"nccl", "nccl", nullptr}, Kind{"cuda_ipc", "cuda_ipc", nullptr}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace moesh
