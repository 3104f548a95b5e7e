// The service binaries' command lines: each binary's options (router/flags.h
// and the workers' flags.h) against its flags. In this process (which links
// every service's flag definitions: the shared groups are defined once, so
// they coexist) the options rendered by ToArgs parse back into the same
// options; against the real binaries, the flags a binary accepts are exactly
// those its options render, so no binary accepts a flag it ignores.
#include <cstdio>
#include <functional>
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

// The flags `binary --helpfull` lists, less Abseil's own (--help, --flagfile, ...).
std::set<std::string> BinaryFlags(const std::string& binary) {
  const std::string cmd = std::string(MOESH_BINARY_DIR) + "/" + binary + " --helpfull 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  EXPECT_NE(f, nullptr) << cmd;
  if (f == nullptr) return {};
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), f)) > 0;) out.append(buf, n);
  pclose(f);
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

// Every field of the device flags away from its default.
DeviceOptions Device() {
  DeviceOptions d;
  d.device = "cuda:1";
  d.gpu_memory_utilization = 0.55;
  d.max_model_len = 100;
  d.dummy_weights = true;
  return d;
}

ServerOptions Server() {
  ServerOptions s;
  s.model = "/models/m";
  s.listen = "0.0.0.0:50051";
  s.ready_file = "/tmp/ready";
  s.metrics_listen = "";  // none
  return s;
}

WorkerOptions Worker() {
  WorkerOptions w;
  w.router = "router:1";
  w.advertise_host = "10.0.0.7";
  w.transport = "ucx";
  return w;
}

ExpertDispatchOptions Dispatch() {
  ExpertDispatchOptions d;
  d.expert_workers = {"e0:1", "e1:2"};
  d.expert_discovery_timeout_s = 5;
  d.micro_batches = 3;
  return d;
}

KvOptions Kv() {
  KvOptions k;
  k.kv_blocks = 7;
  k.block_size = 16;
  k.max_batch = 9;
  return k;
}

// Options with every field away from its default, what the binary reads back
// from flags, and the binary.
template <typename Options>
struct Case {
  Options all;
  std::function<absl::StatusOr<Options>()> from_flags;
  std::string binary;
};

template <typename Options>
void Check(const Case<Options>& c) {
  SCOPED_TRACE(c.binary);
  const std::vector<std::string> args = ToArgs(c.all);
  {
    // Only --model: the binary's defaults are the options' defaults.
    ScopedFlags flags;
    ASSERT_NO_FATAL_FAILURE(flags.Parse({"--model=/models/m"}));
    absl::StatusOr<Options> read = c.from_flags();
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(ToArgs(*read), std::vector<std::string>{"--model=/models/m"});
  }
  {
    // Every field: rendered, parsed and read back to the same command line.
    ScopedFlags flags;
    ASSERT_NO_FATAL_FAILURE(flags.Parse(args));
    absl::StatusOr<Options> read = c.from_flags();
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(ToArgs(*read), args);
  }
  // The binary accepts exactly the flags its options render.
  EXPECT_EQ(BinaryFlags(c.binary), Names(args));
}

TEST(ServiceFlagsTest, Router) {
  Case<RouterOptions> c;
  RouterOptions& o = c.all;
  o.server = Server();
  o.heartbeat_interval_ms = 100;
  o.heartbeat_timeout_ms = 900;
  o.default_max_new_tokens = 11;
  o.max_new_tokens_limit = 12;
  o.max_context_tokens = 13;
  o.rebalance_interval_s = 14;
  o.rebalance_min_ratio = 1.1;
  o.rebalance_slots = 15;
  o.colocated = true;
  o.kv = Kv();
  o.device = Device();
  c.from_flags = RouterOptionsFromFlags;
  c.binary = "moesh_router";
  Check(c);
}

TEST(ServiceFlagsTest, PrefillWorker) {
  Case<PrefillWorkerOptions> c;
  PrefillWorkerOptions& o = c.all;
  o.server = Server();
  o.worker = Worker();
  o.dispatch = Dispatch();
  o.device = Device();
  o.max_batch_tokens = 100;
  o.kv_handoff = "host";
  c.from_flags = PrefillWorkerOptionsFromFlags;
  c.binary = "moesh_prefill_worker";
  Check(c);
}

TEST(ServiceFlagsTest, DecodeWorker) {
  Case<DecodeWorkerOptions> c;
  DecodeWorkerOptions& o = c.all;
  o.server = Server();
  o.worker = Worker();
  o.dispatch = Dispatch();
  o.kv = Kv();
  o.device = Device();
  o.micro_batch_min = 4;
  c.from_flags = DecodeWorkerOptionsFromFlags;
  c.binary = "moesh_decode_worker";
  Check(c);
}

TEST(ServiceFlagsTest, ExpertWorker) {
  Case<ExpertWorkerOptions> c;
  ExpertWorkerOptions& o = c.all;
  o.server = Server();
  o.worker = Worker();
  o.device = Device();
  o.experts = "0-3,6";
  o.shard = "1/2";
  o.batch_window_us = 50;
  c.from_flags = ExpertWorkerOptionsFromFlags;
  c.binary = "moesh_expert_worker";
  Check(c);
}

// What the flag sets above imply, through the binary's own parser: a flag of
// another service is an error, not silently ignored.
TEST(ServiceFlagsTest, BinariesRefuseFlagsTheyDoNotRead) {
  for (const auto& [binary, flag] : std::vector<std::pair<std::string, std::string>>{
           {"moesh_expert_worker", "--kv_blocks=1"},
           {"moesh_expert_worker", "--expert_workers=a:1"},
           {"moesh_router", "--transport=ucx"},
           {"moesh_prefill_worker", "--kv_blocks=1"},
           {"moesh_decode_worker", "--kv_handoff=host"}}) {
    const std::string name = flag.substr(2, flag.find('=') - 2);
    const std::string cmd =
        std::string(MOESH_BINARY_DIR) + "/" + binary + " --model=/nonexistent " + flag + " 2>&1";
    FILE* f = popen(cmd.c_str(), "r");
    ASSERT_NE(f, nullptr);
    std::string out;
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof(buf), f)) > 0;) out.append(buf, n);
    const int status = pclose(f);
    EXPECT_NE(status, 0) << cmd;
    EXPECT_TRUE(absl::StrContains(out, "Unknown command line flag '" + name + "'")) << cmd << ":\n"
                                                                                    << out;
  }
}

}  // namespace
}  // namespace moesh
