// Loading streams: beyond the weights it builds, a load holds about one tensor
// of the checkpoint in host memory (not the checkpoint), an expert worker's
// load reads only its experts' tensors, and loads report their progress.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "base/file_util.h"
#include "common/model/random_checkpoint.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

uint64_t PeakRssBytes() {
  struct rusage u;
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

uint64_t F32Bytes(const std::vector<float>& v) { return v.size() * sizeof(float); }

uint64_t Resident(const MlpWeights& m) { return F32Bytes(m.gate_up) + F32Bytes(m.down); }

uint64_t Resident(const ExpertShardWeights& w) {
  uint64_t n = 0;
  for (const auto& [l, experts] : w.layers) {
    for (const auto& [e, m] : experts) n += Resident(m);
  }
  return n;
}

uint64_t Resident(const AttentionWeights& w) {
  uint64_t n = F32Bytes(w.embed_tokens) + F32Bytes(w.norm) + F32Bytes(w.lm_head);
  for (const AttentionLayerWeights& l : w.layers) {
    for (const std::vector<float>* v :
         {&l.input_layernorm, &l.post_attention_layernorm, &l.q_proj, &l.q_a_proj, &l.q_a_layernorm,
          &l.q_b_proj, &l.kv_a_proj, &l.kv_a_layernorm, &l.kv_b_proj, &l.o_proj, &l.gate,
          &l.gate_bias}) {
      n += F32Bytes(*v);
    }
    n += Resident(l.dense_mlp) + Resident(l.shared_experts);
  }
  return n;
}

struct Measured {
  uint64_t peak_delta = 0;  // growth of this process's peak RSS during the load
  uint64_t resident = 0;    // float32 bytes of the weights built
  bool ok = false;
};

// Runs `load` (returns the bytes of weights it built, 0 on failure) in a
// forked child, so the peak RSS measured is that of the load alone.
Measured InChild(const std::function<uint64_t()>& load) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const uint64_t before = PeakRssBytes();
    Measured m;
    m.resident = load();
    m.peak_delta = PeakRssBytes() - before;
    m.ok = m.resident > 0;
    const ssize_t n = ::write(fds[1], &m, sizeof(m));
    ::_exit(n == sizeof(m) ? 0 : 1);
  }
  ::close(fds[1]);
  Measured m;
  EXPECT_EQ(::read(fds[0], &m, sizeof(m)), static_cast<ssize_t>(sizeof(m)));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  return m;
}

class LoadTest : public ::testing::Test {
 protected:
  // A V3-layout checkpoint of about 250 MB in bf16, in 4 shards.
  static void SetUpTestSuite() {
    dir_ = new std::string(JoinPath(::testing::TempDir(), "load_test_ckpt"));
    std::filesystem::remove_all(*dir_);
    absl::StatusOr<ModelConfig> c = PresetConfig("v3", "small");
    ASSERT_TRUE(c.ok());
    c->n_routed_experts = 96;
    config_ = new ModelConfig(*c);
    RandomCheckpointOptions o;
    o.num_shards = 4;
    ASSERT_TRUE(WriteRandomCheckpoint(*config_, *dir_, o).ok());
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
    delete config_;
  }
  static std::unique_ptr<Checkpoint> Open() {
    absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(*dir_);
    EXPECT_TRUE(ckpt.ok()) << ckpt.status();
    EXPECT_TRUE(ValidateCheckpoint(*config_, **ckpt).ok());
    return std::move(*ckpt);
  }

  static std::string* dir_;
  static ModelConfig* config_;
};
std::string* LoadTest::dir_ = nullptr;
ModelConfig* LoadTest::config_ = nullptr;

TEST_F(LoadTest, FullLoadHoldsAboutOneTensorBeyondTheWeightsItBuilds) {
  const uint64_t model = Open()->total_bytes();
  ASSERT_GT(model, 200u << 20);  // a few hundred MB: the bound below means something
  const Measured m = InChild([] {
    std::unique_ptr<Checkpoint> ckpt = Open();
    absl::StatusOr<std::unique_ptr<AttentionWeights>> attn =
        AttentionWeights::Load(*config_, *ckpt);
    absl::StatusOr<std::unique_ptr<ExpertShardWeights>> experts =
        ExpertShardWeights::Load(*config_, *ckpt, {});
    if (!attn.ok() || !experts.ok()) return uint64_t{0};
    return Resident(**attn) + Resident(**experts);
  });
  ASSERT_TRUE(m.ok);
  EXPECT_GE(m.resident, 2 * model * 95 / 100);  // every bf16 tensor, now float32
  // Beyond the float32 weights it built, the load held well under the model:
  // keeping the mapped checkpoint's pages would add the whole `model`. Not
  // under AddressSanitizer, whose quarantine keeps freed memory resident (up
  // to 256 MB, the size of this bound's margin): the plain build checks it.
  if (kAddressSanitizer) {
    std::printf("peak %llu bytes over resident %llu: not bounded under ASan (its quarantine)\n",
                static_cast<unsigned long long>(m.peak_delta),
                static_cast<unsigned long long>(m.resident));
    return;
  }
  EXPECT_LT(m.peak_delta, m.resident + model / 4)
      << "peak " << m.peak_delta << " resident " << m.resident << " model " << model;
}

TEST_F(LoadTest, ExpertWorkerReadsOnlyItsExpertsAndPeaksNearTheirSize) {
  const std::set<int> ids = {3, 7, 11, 20, 33, 50, 64, 95};  // 1/12 of the experts
  std::unique_ptr<Checkpoint> ckpt = Open();
  std::vector<LoadProgress> seen;
  ckpt->set_progress([&seen](const LoadProgress& p) { seen.push_back(p); });
  absl::StatusOr<std::unique_ptr<ExpertShardWeights>> w =
      ExpertShardWeights::Load(*config_, *ckpt, ids);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::set<std::string> read = ckpt->tensors_read();
  int moe_layers = 0;
  for (int l = 0; l < config_->num_hidden_layers; ++l) moe_layers += config_->IsMoeLayer(l);
  EXPECT_EQ(read.size(), ids.size() * 3 * moe_layers);
  for (const std::string& name : read) {
    EXPECT_TRUE(ids.count(RoutedExpertOf(name))) << name << " is not one of the shard's";
  }
  // Progress: monotonic, ending at the planned total, which is the shard's bytes.
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().bytes_total, ExpertLoadBytes(*config_, *ckpt, ids));
  EXPECT_EQ(seen.back().bytes_done, seen.back().bytes_total);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GT(seen[i].bytes_done, seen[i - 1].bytes_done);

  const uint64_t model = ckpt->total_bytes();
  const Measured m = InChild([&ids] {
    std::unique_ptr<Checkpoint> c = Open();
    absl::StatusOr<std::unique_ptr<ExpertShardWeights>> s =
        ExpertShardWeights::Load(*config_, *c, ids);
    return s.ok() ? Resident(**s) : uint64_t{0};
  });
  ASSERT_TRUE(m.ok);
  // Its float32 experts plus a fixed overhead (headers, allocator), not the
  // checkpoint.
  EXPECT_LT(m.peak_delta, m.resident + (24u << 20)) << "resident " << m.resident;
  EXPECT_LT(m.peak_delta, model / 4) << "resident " << m.resident;
}

TEST(LoadProgressTest, FormatsBytesRateAndEta) {
  LoadProgress p{1'000'000'000, 4'000'000'000, absl::Seconds(2)};
  EXPECT_EQ(FormatLoadProgress("loading", p), "loading: 1.00/4.00 GB (25%) 0.50 GB/s ETA 6s");
  p.bytes_done = p.bytes_total;
  EXPECT_EQ(FormatLoadProgress("loading", p),
            "loading: 4.00/4.00 GB (100%) 2.00 GB/s done in 2.0s");
}

}  // namespace
}  // namespace moesh
