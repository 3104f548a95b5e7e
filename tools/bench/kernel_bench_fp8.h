// kernel_bench's FP8 tables (--fp8, --fp8-grouped): DeepSeek-V3's dense
// linears in block-scaled FP8 and the routed experts' FP8 grouped GEMM, each
// against its baseline measured in the same run.
#ifndef MOESH_TOOLS_BENCH_KERNEL_BENCH_FP8_H_
#define MOESH_TOOLS_BENCH_KERNEL_BENCH_FP8_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/cuda/gemm.h"
#include "tools/bench/bench_util.h"

namespace moesh::cuda {

// The dense linears: quantize + cuBLASLt's FP8 GEMM (and the decode-size
// GEMV) beside the bf16 GEMM of each shape; the FP8 GEMM's 8192^3 rate as
// the ceiling.
absl::Status BenchFp8(CublasGemm& gemm, const Ceilings& ceil, bool quick, cudaStream_t stream);

// The routed experts' FP8 grouped GEMM at V3's prefill shapes against
// cuBLASLt's dense FP8 GEMM of the same rows.
absl::Status BenchFp8Grouped(CublasGemm& gemm, cudaStream_t stream);

}  // namespace moesh::cuda

#endif  // MOESH_TOOLS_BENCH_KERNEL_BENCH_FP8_H_
