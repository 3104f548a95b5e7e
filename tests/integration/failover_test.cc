// Worker failures under live traffic, against real processes (LocalCluster):
// a stream whose decode worker is killed mid-request goes on, on another
// decode worker, with exactly the tokens of an uninterrupted run; with no
// decode worker left it ends UNAVAILABLE in words; an expert worker
// SIGTERMed while requests run drains without failing any.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "base/file_util.h"
#include "cli/local_cluster.h"
#include "common/model/model.h"
#include "gtest/gtest.h"
#include "moesh/v1/generation.grpc.pb.h"
#include "tests/integration/cluster_harness.h"

namespace moesh {
namespace {

constexpr int kLong = 600;  // tokens: the stream outlives the kill at its 10th

// SIGKILLs whichever decode worker of `c` runs a request; its name ("" if none did).
std::string KillTheServingDecodeWorker(LocalCluster& c) {
  for (const char* d : {"decode-0", "decode-1"}) {
    if (Metric(Proc(c, d).metrics_address, "moesh_num_requests_running") == 1) {
      EXPECT_TRUE(c.Signal(d, SIGKILL).ok());
      return d;
    }
  }
  return "";
}

// Streams `req` with two decode workers, killing the one serving it at the
// 10th token; the stream must end OK with the reference's tokens.
void ExpectStreamSurvivesItsDecodeWorker(const std::string& name, const v1::GenerateRequest& req,
                                         const std::vector<int32_t>& want) {
  LocalClusterOptions o = Options(TinyModel(), name);
  o.num_decode = 2;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string router = (*cluster)->router_address();
  std::string killed;
  Result r = Call(router, req, [&](grpc::ClientContext*, int n) {
    if (n == 10) killed = KillTheServingDecodeWorker(**cluster);
  });
  ASSERT_FALSE(killed.empty()) << "no decode worker held the stream";
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.ids, want);  // nothing repeated, nothing lost, nothing different
  // The usage is the request's, not the continuation's.
  EXPECT_EQ(r.final.usage().prompt_tokens(), req.token_ids().ids_size());
  EXPECT_EQ(r.final.usage().completion_tokens(), static_cast<int>(want.size()));
  EXPECT_EQ(r.final.finish_reason(), v1::FINISH_REASON_LENGTH);
  if (req.sampling().top_logprobs() > 0) {
    ASSERT_EQ(r.logprobs.size(), want.size());
    ASSERT_EQ(r.token_logprobs.size(), want.size());
    if (req.sampling().temperature() == 0) {  // greedy: the best alternative is the token
      for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(r.logprobs[i].at(0).first, want[i]) << i;
    }
  }
  EXPECT_EQ(Metric(Proc(**cluster, "router").metrics_address, "moesh_stream_migrations_total"), 1);
  // New requests go to the live decode worker at once (the dead one, still
  // registered until its heartbeats time out, is skipped).
  for (int i = 0; i < 3; ++i) {
    Result again = Call(router, Request({1, 2, 3 + i}, 8));
    EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  }
}

TEST(FailoverTest, GreedyStreamSurvivesItsDecodeWorkerTokenForToken) {
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(TinyModel());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> prompt = {3, 1, 4};
  v1::GenerateRequest req = Request(prompt, kLong, 0.0f, std::nullopt, /*top_logprobs=*/2);
  ExpectStreamSurvivesItsDecodeWorker("failover_greedy", req,
                                      Offline(**model, prompt, kLong).output_ids);
}

// The continuation draws what the uninterrupted run would have drawn
// (Sampler::SeedAtStep), so a seeded sampled stream goes on unchanged too.
TEST(FailoverTest, SeededSampledStreamSurvivesItsDecodeWorker) {
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(TinyModel());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> prompt = {2, 7, 1, 8};
  ExpectStreamSurvivesItsDecodeWorker("failover_sampled", Request(prompt, kLong, 0.7f, 5),
                                      Offline(**model, prompt, kLong, 0.7f, 5).output_ids);
}

// With no other decode worker, the stream ends UNAVAILABLE within seconds,
// saying what happened; the transport's words are not the headline.
TEST(FailoverTest, NoDecodeWorkerLeftIsAnUnavailableInWords) {
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(Options(TinyModel(), "failover_none_left"));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::chrono::steady_clock::time_point killed;
  Result r = Call((*cluster)->router_address(), Request({3, 1, 4}, kLong),
                  [&](grpc::ClientContext*, int n) {
                    if (n != 10) return;
                    ASSERT_TRUE((*cluster)->Signal("decode-0", SIGKILL).ok());
                    killed = std::chrono::steady_clock::now();
                  });
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  const std::string& m = r.status.error_message();
  EXPECT_EQ(m.rfind("a worker serving this stream failed after ", 0), 0u) << m;
  EXPECT_NE(m.find("continuing it elsewhere failed"), std::string::npos) << m;
  EXPECT_NE(m.find("retry"), std::string::npos) << m;
  EXPECT_NE(m.find("decode worker"), std::string::npos) << m;
  EXPECT_LT(std::chrono::steady_clock::now() - killed, std::chrono::seconds(5));
  EXPECT_GE(r.ids.size(), 10u);
  EXPECT_LT(r.ids.size(), static_cast<size_t>(kLong));
}

// --max_stream_migrations=0 keeps the old behaviour: the stream fails.
TEST(FailoverTest, MigrationsCanBeTurnedOff) {
  LocalClusterOptions o = Options(TinyModel(), "failover_off");
  o.num_decode = 2;
  o.router.max_stream_migrations = 0;
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::string killed;
  Result r = Call((*cluster)->router_address(), Request({3, 1, 4}, kLong),
                  [&](grpc::ClientContext*, int n) {
                    if (n == 10) killed = KillTheServingDecodeWorker(**cluster);
                  });
  ASSERT_FALSE(killed.empty());
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_NE(r.status.error_message().find("retry"), std::string::npos);
  EXPECT_EQ(Metric(Proc(**cluster, "router").metrics_address, "moesh_stream_migrations_total"), 0);
}

// SIGTERM to an expert worker whose experts have a replica: it leaves the
// placement map first and serves what still comes until the attention
// workers follow the map without it, then exits cleanly; no request fails
// and every output is unchanged.
TEST(FailoverTest, ASigtermedExpertWorkerDrainsWithoutFailingRequests) {
  LocalClusterOptions o = Options(TinyModel(), "expert_drain");
  o.expert_workers = {"0-7", "0-7"};  // two full replicas, by the router's map
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(TinyModel());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string router = (*cluster)->router_address();
  constexpr int kStreams = 4;
  std::vector<std::vector<int32_t>> prompts, want;
  for (int i = 0; i < kStreams; ++i) {
    prompts.push_back({5, 3, 2 + i});
    want.push_back(Offline(**model, prompts.back(), 400).output_ids);
  }
  absl::Notification signalled;
  std::vector<Result> results(kStreams);
  std::vector<std::thread> streams;
  for (int i = 0; i < kStreams; ++i) {
    streams.emplace_back([&, i] {
      results[i] = Call(router, Request(prompts[i], 400), [&](grpc::ClientContext*, int n) {
        if (i == 0 && n == 10) {
          EXPECT_TRUE((*cluster)->Signal("expert-0", SIGTERM).ok());
          signalled.Notify();
        }
      });
    });
  }
  ASSERT_TRUE(signalled.WaitForNotificationWithTimeout(absl::Seconds(60)));
  // New requests during the drain succeed too.
  for (int i = 0; i < 3; ++i) {
    Result again = Call(router, Request({1, 2, 3 + i}, 8));
    EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  }
  for (std::thread& t : streams) t.join();
  for (int i = 0; i < kStreams; ++i) {
    EXPECT_TRUE(results[i].status.ok()) << i << ": " << results[i].status.error_message();
    EXPECT_EQ(results[i].ids, want[i]) << i;
  }
  absl::StatusOr<int> code = (*cluster)->WaitForExit("expert-0", std::chrono::seconds(20));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);  // it exited on its own, not at the harness's SIGKILL
  absl::StatusOr<std::string> log = ReadFileToString(Proc(**cluster, "expert-0").log_path);
  ASSERT_TRUE(log.ok());
  const size_t left = log->find("expert worker left the cluster");
  const size_t draining = log->find("expert worker draining: ");
  EXPECT_NE(left, std::string::npos) << *log;
  EXPECT_NE(draining, std::string::npos) << *log;
  EXPECT_LT(left, draining) << *log;  // deregistered before it waited
  // Traffic was flowing when the drain began: it did not exit at once.
  EXPECT_EQ(log->find("expert worker draining: 0 "), std::string::npos) << *log;
}

}  // namespace
}  // namespace moesh
