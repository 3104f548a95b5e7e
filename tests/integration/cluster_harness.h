// The cluster tests' harness: a tiny model written once, LocalCluster options
// for a test, a Generate call that collects its stream, the single-process
// reference, a service's metric and a process by name.
#ifndef MOESH_TESTS_INTEGRATION_CLUSTER_HARNESS_H_
#define MOESH_TESTS_INTEGRATION_CLUSTER_HARNESS_H_

#include <errno.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/file_util.h"
#include "cli/local_cluster.h"
#include "common/engine/generate.h"
#include "common/model/model.h"
#include "common/model/random_checkpoint.h"
#include "common/tokenizer/embedded_tokenizers.h"
#include "gtest/gtest.h"
#include "moesh/v1/generation.grpc.pb.h"

namespace moesh {

// A fresh directory for `name`, private to this test binary: ctest runs the
// cluster test binaries in parallel, and each rewrites its tiny model.
inline std::string WorkDir(const std::string& name) {
  const std::string dir =
      JoinPath(::testing::TempDir(), absl::StrCat(program_invocation_short_name, "_", name));
  std::filesystem::remove_all(dir);
  return dir;
}

// A tiny model of `family` (V3 by default) with a long context (for streams
// that outlive a kill), written into WorkDir(name); with `tokenizer`, the tiny
// tokenizer.json that `moesh mkmodel` ships too.
inline std::string WriteTinyModel(const std::string& name, bool tokenizer,
                                  const std::string& family = "v3") {
  const std::string d = WorkDir(name);
  absl::StatusOr<ModelConfig> c = PresetConfig(family, "tiny");
  EXPECT_TRUE(c.ok()) << c.status();
  RandomCheckpointOptions opt;
  opt.seed = 21;
  if (tokenizer) opt.tokenizer_json = std::string(*EmbeddedTokenizerJson("tiny"));
  EXPECT_TRUE(WriteRandomCheckpoint(*c, d, opt).ok());
  return d;
}

inline std::string TinyModel() {
  static const std::string dir = WriteTinyModel("tiny_v3", false);
  return dir;
}

inline std::string TinyTextModel() {
  static const std::string dir = WriteTinyModel("tiny_v3_text", true);
  return dir;
}

inline LocalClusterOptions Options(const std::string& model, const std::string& name) {
  LocalClusterOptions o;
  o.model_dir = model;
  o.bin_dir = MOESH_BINARY_DIR;
  o.work_dir = WorkDir(name);
  o.router.heartbeat_timeout_ms = 1500;
  return o;
}

// A colocated router (attention in the router process) with one expert
// worker holding the tiny model's eight experts; no prefill or decode workers.
inline LocalClusterOptions ColocatedOptions(const std::string& model, const std::string& name) {
  LocalClusterOptions o = Options(model, name);
  o.router.colocated = true;
  o.expert_workers = {"0-7"};
  o.num_prefill = 0;
  o.num_decode = 0;
  return o;
}

struct Result {
  grpc::Status status;
  std::vector<int32_t> ids;
  std::vector<std::vector<std::pair<int32_t, float>>> logprobs;
  v1::FinalInfo final;
  std::vector<float> token_logprobs;   // each token's own, when asked
  v1::PromptLogprobs prompt_logprobs;  // when asked
  // n > 1: ids and finals by GenerateResponse.index.
  std::map<int, std::vector<int32_t>> ids_by_index;
  std::map<int, v1::FinalInfo> finals;
};

inline v1::GenerateRequest Request(const std::vector<int32_t>& prompt, int max_new,
                                   float temperature = 0.0f,
                                   std::optional<uint64_t> seed = std::nullopt,
                                   int top_logprobs = 0) {
  v1::GenerateRequest r;
  for (int32_t t : prompt) r.mutable_token_ids()->add_ids(t);
  r.mutable_sampling()->set_temperature(temperature);
  if (seed) r.mutable_sampling()->set_seed(*seed);
  if (top_logprobs) r.mutable_sampling()->set_top_logprobs(top_logprobs);
  r.mutable_stop()->set_max_new_tokens(max_new);
  r.mutable_stop()->set_ignore_eos(true);
  return r;
}

// Runs one request to completion; `on_token` may cancel via the context.
inline Result Call(const std::string& server, const v1::GenerateRequest& req,
                   const std::function<void(grpc::ClientContext*, int)>& on_token = nullptr) {
  auto stub =
      v1::Generation::NewStub(grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  auto reader = stub->Generate(&ctx, req);
  Result r;
  v1::GenerateResponse m;
  while (reader->Read(&m)) {
    r.token_logprobs.insert(r.token_logprobs.end(), m.token_logprobs().begin(),
                            m.token_logprobs().end());
    if (m.has_prompt_logprobs()) r.prompt_logprobs = m.prompt_logprobs();
    std::vector<int32_t>& by_index = r.ids_by_index[m.index()];
    by_index.insert(by_index.end(), m.token_ids().begin(), m.token_ids().end());
    if (m.has_final()) r.finals[m.index()] = m.final();
    for (int32_t t : m.token_ids()) {
      r.ids.push_back(t);
      if (on_token) on_token(&ctx, static_cast<int>(r.ids.size()));
    }
    for (const auto& lp : m.logprobs()) {
      r.logprobs.emplace_back();
      for (const auto& c : lp.candidates()) r.logprobs.back().push_back({c.id(), c.logprob()});
    }
    if (m.has_final()) r.final = m.final();
  }
  r.status = reader->Finish();
  return r;
}

// The single-process reference.
inline GenerationResult Offline(const Model& model, const std::vector<int32_t>& prompt, int max_new,
                                float temperature = 0, std::optional<uint64_t> seed = std::nullopt,
                                int top_logprobs = 0) {
  SamplingParams sp;
  sp.temperature = temperature;
  sp.seed = seed;
  sp.top_logprobs = top_logprobs;
  StopParams stop;
  stop.max_new_tokens = max_new;
  stop.ignore_eos = true;
  absl::StatusOr<GenerationResult> r = Generate(model, prompt, sp, stop);
  EXPECT_TRUE(r.ok()) << r.status();
  return *r;
}

// GET /metrics from host:port and return the value of the series starting with `series`.
inline double Metric(const std::string& address, const std::string& series) {
  absl::StatusOr<std::string> text = ScrapeMetrics(address);
  return text.ok() ? MetricValue(*text, series) : -1;
}

inline const LocalCluster::Process& Proc(const LocalCluster& c, const std::string& name) {
  for (const auto& p : c.processes()) {
    if (p.name == name) return p;
  }
  static LocalCluster::Process none;
  return none;
}

// True once attention worker `name` logged switching to placement `version`
// (waits up to 10 s).
inline bool SwitchedToPlacement(const LocalCluster& c, const std::string& name, int64_t version) {
  const std::string line = absl::StrCat("placement version ", version, ": switched");
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<std::string> log = ReadFileToString(Proc(c, name).log_path);
    if (log.ok() && log->find(line) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace moesh

#endif  // MOESH_TESTS_INTEGRATION_CLUSTER_HARNESS_H_
