// The prefill engine hands a pass's KVs to the decode workers together: one
// after another, each would land at a decode worker a step after the one
// before it (the import waits for the step running there, and the next step
// starts before the next KV arrives), so a burst of prompts waited a decode
// step per prompt ahead of it for its first token. A decode worker's KV
// handler here holds each handoff until a second one is in flight beside it
// (or two seconds pass): one at a time, no two ever overlap.
#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/service/attention_worker.h"
#include "common/serving/prefill_engine.h"
#include "common/transport/transport.h"
#include "gtest/gtest.h"
#include "router/colocated_test_util.h"

namespace moesh {
namespace {

class GatedKv : public KvHandler {
 public:
  absl::Status PushKv(const KvTransfer& transfer) override {
    absl::MutexLock lock(&mu_);
    ++in_flight_, ++received_;
    most_ = std::max(most_, in_flight_);
    ids_.push_back(transfer.request_id);
    mu_.AwaitWithTimeout(
        absl::Condition(
            +[](GatedKv* g) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g->mu_) { return g->in_flight_ >= 2; },
            this),
        absl::Seconds(2));
    --in_flight_;
    return absl::OkStatus();
  }
  int most() const {
    absl::MutexLock lock(&mu_);
    return most_;
  }
  std::vector<std::string> ids() const {
    absl::MutexLock lock(&mu_);
    return ids_;
  }

 private:
  mutable absl::Mutex mu_;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  int received_ ABSL_GUARDED_BY(mu_) = 0;
  int most_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> ids_ ABSL_GUARDED_BY(mu_);
};

TEST(PrefillHandoffTest, APassHandsItsKvOverTogether) {
  AttentionWorkerOptions opt;
  opt.model_dir = TinyModel("prefill_handoff_test_tiny_v3", 29);
  opt.transport = "inproc";
  opt.device.num_kv_blocks = 256;
  opt.device.block_size = 16;
  absl::StatusOr<AttentionWorker> worker = SetUpAttentionWorker(opt);
  ASSERT_TRUE(worker.ok()) << worker.status();
  GatedKv decode;
  const std::string address = "prefill-handoff-test-decode";
  ASSERT_TRUE(BindInproc(address, nullptr, &decode).ok());
  {
    PrefillEngine engine(worker->backend.get(), worker->experts.get(), worker->kv_transport(), {});
    constexpr int kPrompts = 6;
    std::vector<PrefillSpec> specs(kPrompts);
    std::vector<absl::Status> results(kPrompts);
    std::vector<std::thread> callers;
    for (int i = 0; i < kPrompts; ++i) {
      specs[i].request_id = "handoff-" + std::to_string(i);
      for (int t = 0; t < 24 + i; ++t) specs[i].prompt_ids.push_back(3 + (t * 31 + i * 7) % 200);
      specs[i].decode_address = address;
      callers.emplace_back([&, i] { results[i] = engine.Prefill(specs[i]); });
    }
    for (std::thread& t : callers) t.join();
    for (int i = 0; i < kPrompts; ++i) EXPECT_TRUE(results[i].ok()) << i << ": " << results[i];
    std::vector<std::string> got = decode.ids(), want;
    for (const PrefillSpec& s : specs) want.push_back(s.request_id);
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want);  // every prompt's KV, once
    // The first pass may hold one prompt alone (its handoff then waits out the
    // gate); the prompts queued meanwhile share the next pass.
    EXPECT_GE(decode.most(), 2) << "a pass's KV handoffs went out one at a time";
  }
  UnbindInproc(address);
}

}  // namespace
}  // namespace moesh
