// RunCopyRanges against the bytes it was given: aligned and misaligned
// ranges, a sub-word tail, an empty range, and bytes outside every range
// left alone.
#include "kernels/cuda/copy_ranges.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

using testing::FreshSeed;
using testing::Upload;

TEST(CopyRangesTest, CopiesEveryRangeAndNothingElse) {
  MOESH_REQUIRE_GPU();
  const uint32_t seed = FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  std::mt19937 rng(seed);
  constexpr size_t kBytes = 1 << 20;
  std::vector<uint8_t> src(kBytes), dst(kBytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (auto& b : dst) b = static_cast<uint8_t>(rng());
  MOESH_ASSERT_OK_AND_ASSIGN(auto dsrc, Upload(src));
  MOESH_ASSERT_OK_AND_ASSIGN(auto ddst, Upload(dst));
  struct R {
    size_t dst, src, bytes;
  };
  // 16-byte aligned with a 7-byte tail (and more blocks than one); source
  // and destination misaligned differently; a few bytes; empty.
  const R ranges[] = {{0, 4096, 300007}, {400001, 64, 70003}, {500000, 3, 5}, {600000, 0, 0}};
  CopyRangesParams p;
  for (const R& r : ranges) {
    p.ranges[p.num_ranges++] = {ddst.get() + r.dst, dsrc.get() + r.src, r.bytes};
    for (size_t i = 0; i < r.bytes; ++i) dst[r.dst + i] = src[r.src + i];
  }
  MOESH_ASSERT_OK(RunCopyRanges(p));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  MOESH_ASSERT_OK_AND_ASSIGN(const std::vector<uint8_t> got, ddst.ToHost());
  size_t wrong = 0, first = kBytes;
  for (size_t i = 0; i < kBytes; ++i) {
    if (got[i] != dst[i]) {
      ++wrong;
      first = std::min(first, i);
    }
  }
  EXPECT_EQ(wrong, 0u) << "first wrong byte at " << first;
}

TEST(CopyRangesTest, RefusesTooManyRangesAndNullPointers) {
  CopyRangesParams p;
  p.num_ranges = kMaxCopyRanges + 1;
  EXPECT_EQ(RunCopyRanges(p).code(), absl::StatusCode::kInvalidArgument);
  p.num_ranges = 1;
  p.ranges[0] = {nullptr, nullptr, 16};
  EXPECT_EQ(RunCopyRanges(p).code(), absl::StatusCode::kInvalidArgument);
  p.ranges[0].bytes = 0;  // empty: nothing to do, no device needed
  EXPECT_TRUE(RunCopyRanges(p).ok());
}

}  // namespace
}  // namespace moesh::cuda
