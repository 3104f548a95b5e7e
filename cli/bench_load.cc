// moesh bench --load: how fast a checkpoint loads against how fast the disk
// reads its files, both measured here. Each row first drops the files from
// the page cache (posix_fadvise DONTNEED: no privileges needed; pages another
// process maps stay, so "cold" is best effort and the table says which it got),
// then times one pass: the files read raw (then again from the page cache),
// with --device cuda the GPU's streamed loads (the whole model, and one
// expert worker's shard read from the checkpoint by the device), then the CPU
// engine's full load (attention + every expert, float32; cold and warm) and
// one expert worker's shard load. The GPU rows run first so their peak RSS
// growth is their own (the CPU rows build the float32 model the GPU path used
// to stage on the host).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/status.h"
#include "cli/commands.h"
#include "cli/flags.h"
#include "common/backend/backends.h"
#include "common/model/config.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "common/service/device_flags.h"

namespace moesh::cli {
namespace {

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// This process's peak resident set so far, bytes.
uint64_t PeakRss() {
  struct rusage u;
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_maxrss) * 1024;
}

// Asks the kernel to drop `files` from the page cache; whether every call
// succeeded (pages still mapped elsewhere stay cached regardless).
bool DropFromPageCache(const std::vector<std::string>& files) {
  bool ok = true;
  for (const std::string& f : files) {
    int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      ok = false;
      continue;
    }
    ok = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0 && ok;
    ::close(fd);
  }
  return ok;
}

// Reads `files` start to end with read(2) into a 16 MiB buffer; the bytes.
absl::StatusOr<uint64_t> ReadRaw(const std::vector<std::string>& files) {
  std::vector<char> buf(16u << 20);
  uint64_t total = 0;
  for (const std::string& f : files) {
    int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::InternalError(absl::StrCat(f, ": ", std::strerror(errno)));
    for (;;) {
      const ssize_t n = ::read(fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        ::close(fd);
        return absl::InternalError(absl::StrCat(f, ": read: ", std::strerror(errno)));
      }
      if (n == 0) break;
      total += static_cast<uint64_t>(n);
    }
    ::close(fd);
  }
  return total;
}

uint64_t F32Bytes(const std::vector<float>& v) { return v.size() * sizeof(float); }

uint64_t ResidentBytes(const ExpertShardWeights& w) {
  uint64_t n = 0;
  for (const auto& [l, experts] : w.layers) {
    for (const auto& [e, m] : experts) n += F32Bytes(m.gate_up) + F32Bytes(m.down);
  }
  return n;
}

// The experts of the first of `workers` equal shards (at least one).
std::set<int> FirstShard(const ModelConfig& config, int workers) {
  std::set<int> ids;
  for (int e = 0; e < config.n_routed_experts / workers; ++e) ids.insert(e);
  if (ids.empty()) ids.insert(0);
  return ids;
}

// `peak_delta` < 0: not measured.
void PrintRow(const char* what, uint64_t bytes, double secs, double disk_rate, int64_t peak_delta,
              bool cold) {
  const double rate = bytes / secs;
  const std::string peak = peak_delta < 0 ? "-" : absl::StrFormat("%.1f", peak_delta / 1e6);
  std::printf("%-34s %10.3f %8.2f %9.2f %8.2f %12s %5s\n", what, bytes / 1e9, secs, rate / 1e9,
              disk_rate > 0 ? rate / disk_rate : 0.0, peak.c_str(), cold ? "cold" : "warm");
  std::fflush(stdout);  // row by row, also into a file
}

}  // namespace

absl::Status RunLoadBench() {
  ASSIGN_OR_RETURN(const std::string dir, ModelFlag());
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  RETURN_IF_ERROR(ValidateCheckpoint(config, *ckpt));
  ckpt->set_progress(nullptr);  // the table is the report
  const std::vector<std::string> files = ckpt->files();
  const int workers = std::max(1, absl::GetFlag(FLAGS_expert_workers));
  std::printf("model %s: %zu file(s), %.3f GB of tensors; expert shard = 1/%d of %d experts\n",
              dir.c_str(), files.size(), ckpt->total_bytes() / 1e9, workers,
              config.n_routed_experts);
  std::printf("%-34s %10s %8s %9s %8s %12s %5s\n", "pass", "GB", "s", "GB/s", "vs disk",
              "peak RSS +MB", "cache");

  bool cold = DropFromPageCache(files);
  auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const uint64_t raw, ReadRaw(files));
  const double disk_secs = Since(t0);
  const double disk_rate = raw / disk_secs;
  PrintRow("disk: files read raw (read(2))", raw, disk_secs, disk_rate, -1, cold);

  t0 = std::chrono::steady_clock::now();  // the files are cached now
  ASSIGN_OR_RETURN(const uint64_t warm, ReadRaw(files));
  PrintRow("page cache: files read raw again", warm, Since(t0), disk_rate, -1, false);

  ASSIGN_OR_RETURN(DeviceOptions device, DeviceOptionsFromFlags());
  if (IsCudaDevice(device.device)) {
    // The shard first: its row's peak includes the CUDA context's host memory,
    // so the engine row's growth is the load's own.
    const std::set<int> ids = FirstShard(config, workers);
    cold = DropFromPageCache(files);
    uint64_t peak0 = PeakRss();
    t0 = std::chrono::steady_clock::now();
    uint64_t bytes = ExpertLoadBytes(config, *ckpt, ids);
    ASSIGN_OR_RETURN(std::unique_ptr<ExpertShardWeights> shard,
                     ExpertShardWeights::Deferred(config, *ckpt, ids));
    ASSIGN_OR_RETURN(std::unique_ptr<ExpertStage> stage,
                     MakeExpertStage(config, std::move(shard), device));
    PrintRow("load: GPU expert shard (streamed)", bytes, Since(t0), disk_rate,
             static_cast<int64_t>(PeakRss() - peak0), cold);
    std::printf("  (that peak includes the CUDA context's host memory)\n");
    cold = DropFromPageCache(files);
    peak0 = PeakRss();
    t0 = std::chrono::steady_clock::now();
    bytes = AttentionLoadBytes(config, *ckpt) + ExpertLoadBytes(config, *ckpt, {});
    ASSIGN_OR_RETURN(std::unique_ptr<AttentionBackend> backend,
                     MakeAttentionBackend(config, ckpt.get(), device, /*with_experts=*/true));
    PrintRow("load: GPU engine (all, streamed)", bytes, Since(t0), disk_rate,
             static_cast<int64_t>(PeakRss() - peak0), cold);
  }
  for (const bool drop : {true, false}) {  // The CPU engine's load: attention + every expert.
    cold = drop && DropFromPageCache(files);
    const uint64_t peak0 = PeakRss();
    t0 = std::chrono::steady_clock::now();
    const uint64_t bytes = AttentionLoadBytes(config, *ckpt) + ExpertLoadBytes(config, *ckpt, {});
    ASSIGN_OR_RETURN(std::unique_ptr<AttentionWeights> attn, AttentionWeights::Load(config, *ckpt));
    ASSIGN_OR_RETURN(std::unique_ptr<ExpertShardWeights> experts,
                     ExpertShardWeights::Load(config, *ckpt, {}));
    const double secs = Since(t0);
    // The peak grows once: the second pass's would only repeat the first's.
    PrintRow("load: CPU engine (all, to f32)", bytes, secs, disk_rate,
             drop ? static_cast<int64_t>(PeakRss() - peak0) : -1, cold);
    if (drop) {
      std::printf("  (float32 experts built: %.1f MB, in the peak with the attention weights)\n",
                  ResidentBytes(*experts) / 1e6);
    }
  }
  {  // One expert worker's shard.
    const std::set<int> ids = FirstShard(config, workers);
    cold = DropFromPageCache(files);
    t0 = std::chrono::steady_clock::now();
    const uint64_t bytes = ExpertLoadBytes(config, *ckpt, ids);
    ASSIGN_OR_RETURN(std::unique_ptr<ExpertShardWeights> shard,
                     ExpertShardWeights::Load(config, *ckpt, ids));
    const double secs = Since(t0);
    PrintRow("load: expert worker shard (to f32)", bytes, secs, disk_rate, -1, cold);
  }
  std::printf(
      "(vs disk: the load's bytes/s over the raw read's; cold: the page cache was "
      "dropped first)\n");
  return absl::OkStatus();
}

}  // namespace moesh::cli
