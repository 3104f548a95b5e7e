// RemoteExpertClient over both memory kinds with fake workers that need no
// GPU: a "device" dispatch here lies in host memory tagged as CUDA device 0,
// which the fake channels read directly. Routing, serve masks, the sum over
// workers and failover are the client's own; both kinds give one answer.
#include "common/transport/remote_expert_client.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "base/dtype.h"
#include "base/status.h"
#include "common/transport/posted_dispatch.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

constexpr int kExperts = 4, kHidden = 4, kTopK = 2, kTokens = 3;

// Expert e's output for a row x: (e + 1) · x.
void AddExperts(const MoeDispatch& d, const float* x, const uint8_t* serve, bool overwrite,
                float* out) {
  for (int t = 0; t < d.num_tokens; ++t) {
    float* row = out + static_cast<size_t>(t) * d.hidden;
    if (overwrite) std::fill(row, row + d.hidden, 0.0f);
    for (int k = 0; k < d.top_k; ++k) {
      const int e = d.topk_ids[t * d.top_k + k];
      if (e < 0 || (serve != nullptr && serve[e] == 0)) continue;
      for (int i = 0; i < d.hidden; ++i)
        row[i] += d.topk_weights[t * d.top_k + k] * (e + 1) * x[t * d.hidden + i];
    }
  }
}

// Workers reached through channels that move host memory and, with
// `device` >= 0, that device's (posted).
class FakeWorkers : public Transport {
 public:
  struct Worker {
    bool up = true;
    bool refuse = false;  // answers posted dispatches INVALID_ARGUMENT
    int hosts = 0, posts = 0;
    std::vector<uint8_t> last_serve;
  };
  explicit FakeWorkers(int device) : device_(device) {}
  absl::string_view name() const override { return "fake"; }
  absl::StatusOr<std::unique_ptr<DataChannel>> Connect(const std::string& address) override {
    absl::MutexLock lock(&mu_);
    if (!workers_[address].up) return absl::UnavailableError(address + " is down");
    return std::unique_ptr<DataChannel>(new Channel(this, address));
  }
  Worker& at(const std::string& a) {
    absl::MutexLock lock(&mu_);
    return workers_[a];
  }

 private:
  class Channel : public DataChannel {
   public:
    Channel(FakeWorkers* t, std::string address) : t_(t), address_(std::move(address)) {}
    MemoryKinds memory_kinds() const override { return {t_->device_}; }
    absl::Status Dispatch(const MoeDispatch& d, float* out) override {
      RETURN_IF_ERROR(CheckHostDispatch(d, address_));
      RETURN_IF_ERROR(Up());
      ++t_->at(address_).hosts;
      AddExperts(d, d.hidden_f32(), nullptr, /*overwrite=*/true, out);
      return absl::OkStatus();
    }
    absl::Status Post(const MoeDispatch& d) override {
      if (t_->device_ < 0) return DataChannel::Post(d);
      RETURN_IF_ERROR(CheckPostable(d, t_->device_, address_));
      RETURN_IF_ERROR(posted_.CheckNoneInFlight());
      RETURN_IF_ERROR(Up());
      Worker& w = t_->at(address_);
      ++w.posts;
      w.last_serve.assign(d.serve, d.serve + d.num_experts);
      dispatch_ = d;
      posted_ = {d.num_tokens, d.hidden, d.stream};
      return absl::OkStatus();
    }
    absl::Status Collect(float* out, bool accumulate) override {
      ASSIGN_OR_RETURN(const PostedDispatch posted, posted_.Take());
      RETURN_IF_ERROR(Up());
      if (t_->at(address_).refuse) return absl::InvalidArgumentError("refused (test)");
      std::vector<float> x(static_cast<size_t>(posted.tokens) * posted.hidden);
      for (size_t i = 0; i < x.size(); ++i) x[i] = Bf16ToF32(dispatch_.hidden_bf16()[i]);
      AddExperts(dispatch_, x.data(), t_->at(address_).last_serve.data(), !accumulate, out);
      return absl::OkStatus();
    }
    absl::Status PushKv(const KvTransfer&) override { return absl::OkStatus(); }
    const std::string& peer() const override { return address_; }

   private:
    absl::Status Up() {
      if (!t_->at(address_).up) return absl::UnavailableError(address_ + ": channel broken");
      return absl::OkStatus();
    }
    FakeWorkers* const t_;
    const std::string address_;
    PostedDispatch posted_;
    MoeDispatch dispatch_;
  };
  const int device_;
  absl::Mutex mu_;
  std::map<std::string, Worker> workers_ ABSL_GUARDED_BY(mu_);
};

// kTokens tokens, values exact in bf16, routed over all four experts.
struct Tokens {
  std::vector<float> x;
  std::vector<uint16_t> x_bf16;
  std::vector<int32_t> ids = {0, 1, 2, 3, 1, 2};
  std::vector<float> w = {0.5f, 0.25f, 1.0f, 0.5f, 2.0f, 1.0f};
  Tokens() {
    for (int i = 0; i < kTokens * kHidden; ++i) {
      x.push_back(0.25f * (i % 7) - 0.5f);
      x_bf16.push_back(F32ToBf16(x.back()));
    }
  }
  MoeDispatch Host() const {
    MoeDispatch d;
    d.layer = 1, d.num_tokens = kTokens, d.hidden = kHidden, d.top_k = kTopK;
    d.hidden_states = x.data(), d.topk_ids = ids.data(), d.topk_weights = w.data();
    return d;
  }
  MoeDispatch Device() const {
    MoeDispatch d = Host();
    d.memory = DispatchMemory::CudaDevice(0);
    d.hidden_states = x_bf16.data();
    return d;
  }
  std::vector<float> Want() const {
    std::vector<float> out(x.size());
    AddExperts(Host(), x.data(), nullptr, true, out.data());
    return out;
  }
};

TEST(RemoteExpertClientTest, HostAndDeviceDispatchesGiveOneAnswer) {
  FakeWorkers t(/*device=*/0);
  auto client = RemoteExpertClient::Create(&t, {{"a", {0, 1}}, {"b", {2, 3}}}, kExperts);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->memory_kinds().device, 0);
  const Tokens tok;
  std::vector<float> host(tok.x.size()), device(tok.x.size(), 7.0f);
  const absl::Status s = (*client)->Run(tok.Host(), host.data());
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE((*client)->Run(tok.Device(), device.data()).ok());
  EXPECT_EQ(host, tok.Want());
  EXPECT_EQ(device, tok.Want());
  EXPECT_EQ(t.at("a").hosts, 1);
  EXPECT_EQ(t.at("b").hosts, 1);
  // The device dispatch goes whole to each worker with its experts' mask.
  EXPECT_EQ(t.at("a").posts, 1);
  EXPECT_EQ(t.at("a").last_serve, (std::vector<uint8_t>{1, 1, 0, 0}));
  EXPECT_EQ(t.at("b").last_serve, (std::vector<uint8_t>{0, 0, 1, 1}));
}

TEST(RemoteExpertClientTest, ADeviceDispatchFailsOverLikeAHostOne) {
  FakeWorkers t(/*device=*/0);
  auto client = RemoteExpertClient::Create(&t, {{"a", {0, 1, 2, 3}}, {"b", {0, 1, 2, 3}}}, kExperts,
                                           std::chrono::seconds(60));
  ASSERT_TRUE(client.ok()) << client.status();
  const Tokens tok;
  std::vector<float> out(tok.x.size());
  t.at("a").up = false;
  ASSERT_TRUE((*client)->Run(tok.Device(), out.data()).ok());  // the replica takes over
  EXPECT_EQ(out, tok.Want());
  EXPECT_EQ(t.at("b").last_serve, (std::vector<uint8_t>{1, 1, 1, 1}));
  // Worker a is routed around from now on; b lost under the step is reported.
  EXPECT_EQ((*client)->CheckDeviceDispatches().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE((*client)->CheckDeviceDispatches().ok());
  // A refusal is the caller's: returned as it is, the worker kept.
  t.at("b").refuse = true;
  EXPECT_EQ((*client)->Run(tok.Device(), out.data()).code(), absl::StatusCode::kInvalidArgument);
  t.at("b").refuse = false;
  ASSERT_TRUE((*client)->Run(tok.Device(), out.data()).ok());
  EXPECT_EQ(t.at("b").posts, 4);  // the failed attempt's, the retry's, the refused, this
}

TEST(RemoteExpertClientTest, RefusesMemoryItsTransportDoesNotMove) {
  FakeWorkers t(/*device=*/-1);
  auto client = RemoteExpertClient::Create(&t, {{"a", {0, 1, 2, 3}}}, kExperts);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->memory_kinds().device, -1);
  const Tokens tok;
  std::vector<float> out(tok.x.size());
  const absl::Status s = (*client)->Run(tok.Device(), out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("cuda:0 bf16"), std::string::npos) << s;
  EXPECT_EQ(t.at("a").posts, 0);
  ASSERT_TRUE((*client)->Run(tok.Host(), out.data()).ok());  // nobody was marked down
  EXPECT_EQ(out, tok.Want());
}

}  // namespace
}  // namespace moesh
