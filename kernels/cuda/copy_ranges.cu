#include <algorithm>
#include <cstdint>

#include "kernels/cuda/copy_ranges.h"
#include "kernels/cuda/cuda_status.h"

namespace moesh::cuda {
namespace {

constexpr int kThreads = 256;

// Range r takes blocks [first[r], first[r + 1]); each block strides over its
// range's 16-byte words (or bytes, where the pointers are not both aligned).
struct Plan {
  CopyRangesParams::Range ranges[kMaxCopyRanges];
  int first[kMaxCopyRanges + 1];
  int num_ranges;
};

__global__ void __launch_bounds__(kThreads) CopyRangesKernel(Plan plan) {
  int r = 0;
  while (r + 1 < plan.num_ranges && static_cast<int>(blockIdx.x) >= plan.first[r + 1]) ++r;
  const CopyRangesParams::Range range = plan.ranges[r];
  const size_t blocks = static_cast<size_t>(plan.first[r + 1] - plan.first[r]);
  const size_t t = static_cast<size_t>(blockIdx.x - plan.first[r]) * kThreads + threadIdx.x;
  const size_t stride = blocks * kThreads;
  const auto dst = reinterpret_cast<uintptr_t>(range.dst);
  const auto src = reinterpret_cast<uintptr_t>(range.src);
  if (((dst | src) & 15) == 0) {
    const size_t words = range.bytes / 16;
    uint4* d = reinterpret_cast<uint4*>(range.dst);
    const uint4* s = reinterpret_cast<const uint4*>(range.src);
    for (size_t i = t; i < words; i += stride) d[i] = s[i];
    for (size_t i = words * 16 + t; i < range.bytes; i += stride)
      static_cast<uint8_t*>(range.dst)[i] = static_cast<const uint8_t*>(range.src)[i];
  } else {
    for (size_t i = t; i < range.bytes; i += stride)
      static_cast<uint8_t*>(range.dst)[i] = static_cast<const uint8_t*>(range.src)[i];
  }
}

}  // namespace

absl::Status RunCopyRanges(const CopyRangesParams& p) {
  if (p.num_ranges < 0 || p.num_ranges > kMaxCopyRanges) {
    return absl::InvalidArgumentError("RunCopyRanges: 0 to kMaxCopyRanges ranges");
  }
  Plan plan{};
  int blocks = 0;
  for (int i = 0; i < p.num_ranges; ++i) {
    const CopyRangesParams::Range& r = p.ranges[i];
    if (r.bytes == 0) continue;
    if (r.dst == nullptr || r.src == nullptr)
      return absl::InvalidArgumentError("RunCopyRanges: null pointer in a non-empty range");
    // A block per 8 KB (2 words a thread at 16 bytes), at most 1024 a range.
    const size_t want = (r.bytes + 8191) / 8192;
    plan.ranges[plan.num_ranges] = r;
    plan.first[plan.num_ranges] = blocks;
    blocks += static_cast<int>(std::min<size_t>(want, 1024));
    ++plan.num_ranges;
  }
  if (plan.num_ranges == 0) return absl::OkStatus();
  plan.first[plan.num_ranges] = blocks;
  CopyRangesKernel<<<blocks, kThreads, 0, p.stream>>>(plan);
  return LaunchStatus("CopyRangesKernel");
}

}  // namespace moesh::cuda
