// What the colocated backend's tests share: tiny random models, a backend
// over one, a metric's value and the check that the engines went back to idle.
#ifndef MOESH_ROUTER_COLOCATED_TEST_UTIL_H_
#define MOESH_ROUTER_COLOCATED_TEST_UTIL_H_

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "base/file_util.h"
#include "common/metrics/metrics.h"
#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"
#include "router/colocated_backend.h"

namespace moesh {

// A tiny checkpoint of `family` with random weights (`seed`) in the test's
// temporary directory under `name`, written once per process and name.
inline std::string TinyModel(const std::string& name, uint64_t seed,
                             const std::string& family = "v3") {
  static auto* dirs = new std::map<std::string, std::string>();
  std::string& dir = (*dirs)[name];
  if (dir.empty()) {
    dir = JoinPath(::testing::TempDir(), name);
    std::filesystem::remove_all(dir);
    absl::StatusOr<ModelConfig> c = PresetConfig(family, "tiny");
    RandomCheckpointOptions opt;
    opt.seed = seed;
    EXPECT_TRUE(c.ok() && WriteRandomCheckpoint(*c, dir, opt).ok()) << family;
  }
  return dir;
}

// A colocated backend over `model` with a pool of `blocks` blocks of
// `block_size` tokens; null (the test failing) if it does not start.
inline std::unique_ptr<ColocatedBackend> NewColocated(const std::string& model, int blocks,
                                                      int block_size, bool prefix_cache,
                                                      const DecodeEngineOptions& decode,
                                                      const PrefillEngineOptions& prefill = {}) {
  DeviceOptions device;
  device.num_kv_blocks = blocks;
  device.block_size = block_size;
  device.prefix_cache = prefix_cache;
  absl::StatusOr<std::unique_ptr<ColocatedBackend>> b =
      ColocatedBackend::Create(model, device, decode, prefill);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? std::move(*b) : nullptr;
}

// The sum of a metric's series in `metrics` whose labels include
// `label`=`value` (every series with an empty `label`): counters' and
// gauges' values, histograms' sample counts; -1 if there is no such metric.
inline double MetricSum(Metrics* metrics, const std::string& name, const std::string& label = "",
                        const std::string& value = "") {
  for (const prometheus::MetricFamily& f : metrics->registry().Collect()) {
    if (f.name != name) continue;
    double sum = 0;
    for (const prometheus::ClientMetric& m : f.metric) {
      bool match = label.empty();
      for (const prometheus::ClientMetric::Label& l : m.label)
        match = match || (l.name == label && l.value == value);
      if (!match) continue;
      switch (f.type) {
        case prometheus::MetricType::Counter:
          sum += m.counter.value;
          break;
        case prometheus::MetricType::Histogram:
          sum += static_cast<double>(m.histogram.sample_count);
          break;
        default:
          sum += m.gauge.value;
      }
    }
    return sum;
  }
  return -1;
}

// The decode engine back to idle: every block free, nothing running or queued.
inline void ExpectIdle(ColocatedBackend* b, int64_t all_free) {
  ServingLoad load = b->decode()->Load();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while ((load.in_flight != 0 || load.free_kv_blocks != all_free) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    load = b->decode()->Load();
  }
  EXPECT_EQ(load.free_kv_blocks, all_free);
  EXPECT_EQ(load.num_running, 0);
  EXPECT_EQ(load.num_waiting, 0);
  EXPECT_EQ(load.in_flight, 0);
}

}  // namespace moesh

#endif  // MOESH_ROUTER_COLOCATED_TEST_UTIL_H_
