// What the colocated backend's tests share: a tiny random model and the
// check that the engines went back to idle.
#ifndef MOESH_ROUTER_COLOCATED_TEST_UTIL_H_
#define MOESH_ROUTER_COLOCATED_TEST_UTIL_H_

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>

#include "base/file_util.h"
#include "common/model/random_checkpoint.h"
#include "gtest/gtest.h"
#include "router/colocated_backend.h"

namespace moesh {

// A tiny V3 checkpoint of random weights (`seed`) in the test's temporary
// directory under `name`, written once per process.
inline std::string TinyModel(const std::string& name, uint64_t seed) {
  static const std::string dir = [&] {
    const std::string d = JoinPath(::testing::TempDir(), name);
    std::filesystem::remove_all(d);
    absl::StatusOr<ModelConfig> c = PresetConfig("v3", "tiny");
    RandomCheckpointOptions opt;
    opt.seed = seed;
    EXPECT_TRUE(c.ok() && WriteRandomCheckpoint(*c, d, opt).ok());
    return d;
  }();
  return dir;
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
