// Several device-to-device copies in one launch: what cudaMemcpyAsync makes
// one operation each (a copy kernel or a copy-engine job, each with its own
// start-up on the stream) — e.g. a cuda_ipc dispatch's hidden states, ids
// and weights into the exported input region, one MoE layer at a time.
#ifndef MOESH_KERNELS_CUDA_COPY_RANGES_H_
#define MOESH_KERNELS_CUDA_COPY_RANGES_H_

#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"

namespace moesh::cuda {

inline constexpr int kMaxCopyRanges = 4;

struct CopyRangesParams {
  struct Range {
    void* dst = nullptr;
    const void* src = nullptr;
    size_t bytes = 0;
  };
  Range ranges[kMaxCopyRanges];
  int num_ranges = 0;  // in [0, kMaxCopyRanges]
  cudaStream_t stream = nullptr;
};

// dst[i][0, bytes[i]) = src[i][0, bytes[i]) for every range, on p.stream.
// Ranges must not overlap one another (each byte written by one thread, in
// no order). Any alignment: 16-byte words where both pointers allow, bytes
// otherwise. Empty ranges are skipped; nothing at all is launched when every
// range is empty. INVALID_ARGUMENT for more than kMaxCopyRanges ranges or a
// null pointer in a non-empty range.
absl::Status RunCopyRanges(const CopyRangesParams& p);

}  // namespace moesh::cuda

#endif  // MOESH_KERNELS_CUDA_COPY_RANGES_H_
