// The service binaries' command lines: each binary's options (router/flags.h
// and the workers' flags.h) against its flags. In this process (which links
// every service's flag definitions: the shared groups are defined once, so
// they coexist) the options rendered by ToArgs parse back into the same
// options; against the real binaries, the flags a binary accepts are exactly
// those its options render, so no binary accepts a flag it ignores.
#include <cstdio>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "decode_worker/flags.h"
#include "expert_worker/flags.h"
#include "gtest/gtest.h"
#include "prefill_worker/flags.h"
#include "router/flags.h"

namespace moesh {
namespace {

// Sets the flags `args` names (each --name=value) the way the binary's
// command-line parser would, and puts them back as they were on destruction
// (absl::FlagSaver would too, logging every flag).
class ScopedFlags {
 public:
  ~ScopedFlags() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      std::string error;
      EXPECT_TRUE(it->first->ParseFrom(it->second, &error)) << error;
    }
  }
  // Fails on a flag that is not defined.
  void Parse(const std::vector<std::string>& args) {
    for (const std::string& a : args) {
      ASSERT_TRUE(absl::StartsWith(a, "--")) << a;
      const size_t eq = a.find('=');
      ASSERT_NE(eq, std::string::npos) << a;
      absl::CommandLineFlag* flag = absl::FindCommandLineFlag(a.substr(2, eq - 2));
      ASSERT_NE(flag, nullptr) << a << ": no such flag";
      saved_.emplace_back(flag, flag->CurrentValue());
      std::string error;
      ASSERT_TRUE(flag->ParseFrom(a.substr(eq + 1), &error)) << a << ": " << error;
    }
  }

 private:
  std::vector<std::pair<absl::CommandLineFlag*, std::string>> saved_;
};

std::set<std::string> Names(const std::vector<std::string>& args) {
  std::set<std::string> out;
  for (const std::string& a : args) out.insert(a.substr(2, a.find('=') - 2));
  return out;
}

// Runs `cmd`: what it writes into *out, its exit status (pclose's) into *status.
void RunCommand(const std::string& cmd, std::string* out, int* status) {
  FILE* f = popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr) << cmd;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), f)) > 0;) out->append(buf, n);
  *status = pclose(f);
}

// The flags `binary --helpfull` lists, less Abseil's own (--help, --flagfile, ...).
std::set<std::string> BinaryFlags(const std::string& binary) {
  std::string out;
  int status;
  RunCommand(std::string(MOESH_BINARY_DIR) + "/" + binary + " --helpfull 2>&1", &out, &status);
  std::set<std::string> flags;
  bool ours = false;
  const std::regex header(R"(^\s*Flags from (.*):$)"), flag(R"(^\s+--([a-z_0-9]+) \()");
  std::smatch m;
  std::string line;
  for (size_t start = 0, end; start < out.size(); start = end + 1) {
    end = out.find('\n', start);
    if (end == std::string::npos) end = out.size();
    line = out.substr(start, end - start);
    if (std::regex_match(line, m, header)) {
      ours = m[1].str().find("absl/") == std::string::npos;
    } else if (ours && std::regex_search(line, m, flag)) {
      flags.insert(m[1].str());
    }
  }
  return flags;
}

// Every field of each flag group away from its default.
void SetAll(DeviceOptions* d) {
  d->device = "cuda:1";
  d->gpu_memory_utilization = 0.55;
  d->max_model_len = 100;
  d->dummy_weights = true;
  d->fp8_linears = true;
  d->fp8_kv_cache = true;
}

void SetAll(ServerOptions* s) {
  s->model = "/models/m";
  s->listen = "0.0.0.0:50051";
  s->ready_file = "/tmp/ready";
  s->metrics_listen = "";  // none
  s->max_receive_message_mb = 64;
  s->drain_timeout_s = 7;
  s->tls = {"/certs/tls.crt", "/certs/tls.key", "/certs/ca.crt", 17};
}

void SetAll(WorkerOptions* w) {
  w->router = "router:1";
  w->advertise_host = "10.0.0.7";
  w->transport = "ucx";
}

void SetAll(ExpertDispatchOptions* d) {
  d->expert_workers = {"e0:1", "e1:2"};
  d->expert_discovery_timeout_s = 5;
  d->micro_batches = 3;
  d->dispatch_dtype = "fp8";
}

void SetAll(KvOptions* k) {
  k->kv_blocks = 7;
  k->block_size = 16;
  k->max_batch = 9;
  k->max_waiting_requests = 5;
  k->enable_prefix_caching = false;
  k->max_num_batched_tokens = 48;
  k->preemption_mode = "swap";
  k->swap_space_mb = 12;
}

// The same for several groups: SetAll(&o.server, &o.worker).
template <typename... Groups>
void SetAll(Groups*... groups) {
  (SetAll(groups), ...);
}

// `all` (options with every field away from its default) against what the
// binary reads back from flags (`from_flags`) and against the binary.
template <typename Options>
void Check(const Options& all, absl::StatusOr<Options> (*from_flags)(), const std::string& binary) {
  SCOPED_TRACE(binary);
  const std::vector<std::string> args = ToArgs(all);
  {
    // Only --model: the binary's defaults are the options' defaults.
    ScopedFlags flags;
    ASSERT_NO_FATAL_FAILURE(flags.Parse({"--model=/models/m"}));
    absl::StatusOr<Options> read = from_flags();
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(ToArgs(*read), std::vector<std::string>{"--model=/models/m"});
  }
  {
    // Every field: rendered, parsed and read back to the same command line.
    ScopedFlags flags;
    ASSERT_NO_FATAL_FAILURE(flags.Parse(args));
    absl::StatusOr<Options> read = from_flags();
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(ToArgs(*read), args);
  }
  // The binary accepts exactly the flags its options render.
  EXPECT_EQ(BinaryFlags(binary), Names(args));
}

TEST(ServiceFlagsTest, Router) {
  RouterOptions o;
  SetAll(&o.server, &o.kv, &o.device);
  o.internal_listen = "0.0.0.0:50052";
  o.public_tls = true;
  o.http_listen = "0.0.0.0:8000";
  o.http_max_body_mb = 3;
  o.http_threads = 7;
  o.http_keep_alive_ms = 250;
  o.served_model_name = "tiny";
  o.api_keys_file = "/keys";
  o.heartbeat_interval_ms = 100;
  o.heartbeat_timeout_ms = 900;
  o.default_max_new_tokens = 11;
  o.max_new_tokens_limit = 12;
  o.max_context_tokens = 13;
  o.rebalance_interval_s = 14;
  o.rebalance_min_ratio = 1.1;
  o.rebalance_slots = 15;
  o.routing_policy = RoutingPolicy::kRoundRobin;
  o.max_stream_migrations = 5;
  o.max_local_prefill_tokens = 64;
  o.colocated = true;
  Check(o, RouterOptionsFromFlags, "moesh_router");
}

TEST(ServiceFlagsTest, PrefillWorker) {
  PrefillWorkerOptions o;
  SetAll(&o.server, &o.worker, &o.dispatch, &o.kv, &o.device);
  o.max_batch_tokens = 100;
  o.kv_handoff = "host";
  Check(o, PrefillWorkerOptionsFromFlags, "moesh_prefill_worker");
}

TEST(ServiceFlagsTest, DecodeWorker) {
  DecodeWorkerOptions o;
  SetAll(&o.server, &o.worker, &o.dispatch, &o.kv, &o.device);
  o.micro_batch_min = 4;
  o.max_pending_kv_share = 0.25;
  Check(o, DecodeWorkerOptionsFromFlags, "moesh_decode_worker");
}

TEST(ServiceFlagsTest, ExpertWorker) {
  ExpertWorkerOptions o;
  SetAll(&o.server, &o.worker, &o.device);
  o.experts = "0-3,6";
  o.shard = "1/2";
  o.batch_window_us = 50;
  Check(o, ExpertWorkerOptionsFromFlags, "moesh_expert_worker");
}

// What the flag sets above imply, through the binary's own parser: a flag of
// another service is an error, not silently ignored.
TEST(ServiceFlagsTest, BinariesRefuseFlagsTheyDoNotRead) {
  for (const auto& [binary, flag] : std::vector<std::pair<std::string, std::string>>{
           {"moesh_expert_worker", "--kv_blocks=1"},
           {"moesh_expert_worker", "--expert_workers=a:1"},
           {"moesh_router", "--transport=ucx"},
           {"moesh_prefill_worker", "--max_pending_kv_share=0.5"},
           {"moesh_decode_worker", "--kv_handoff=host"}}) {
    const std::string name = flag.substr(2, flag.find('=') - 2);
    const std::string cmd =
        std::string(MOESH_BINARY_DIR) + "/" + binary + " --model=/nonexistent " + flag + " 2>&1";
    std::string out;
    int status = 0;
    ASSERT_NO_FATAL_FAILURE(RunCommand(cmd, &out, &status));
    EXPECT_NE(status, 0) << cmd;
    EXPECT_TRUE(absl::StrContains(out, "Unknown command line flag '" + name + "'")) << cmd << ":\n"
                                                                                    << out;
  }
}

// A negative chunked-prefill budget is refused by each service reading it,
// with the flag named, before anything starts.
TEST(ServiceFlagsTest, ANegativeTokenBudgetIsRefused) {
  for (const std::string binary :
       {"moesh_router --colocated", "moesh_prefill_worker", "moesh_decode_worker"}) {
    const std::string cmd = std::string(MOESH_BINARY_DIR) + "/" + binary +
                            " --model=/nonexistent --max_num_batched_tokens=-1 2>&1";
    std::string out;
    int status = 0;
    ASSERT_NO_FATAL_FAILURE(RunCommand(cmd, &out, &status));
    EXPECT_NE(status, 0) << cmd;
    EXPECT_TRUE(absl::StrContains(out, "--max_num_batched_tokens must be >= 0")) << cmd << ":\n"
                                                                                 << out;
  }
}

}  // namespace
}  // namespace moesh
