#include "tools/bench/bench_util.h"

#include "base/status.h"
#include "kernels/cuda/fill.h"

namespace moesh::cuda {

absl::StatusOr<Ceilings> MeasureCeilings(CublasGemm& gemm, cudaStream_t stream) {
  Ceilings c;
  const size_t bytes = size_t{2} << 30;
  ASSIGN_OR_RETURN(auto src, DeviceBuffer<uint8_t>::Create(bytes));
  ASSIGN_OR_RETURN(auto dst, DeviceBuffer<uint8_t>::Create(bytes));
  RETURN_IF_ERROR(FillUniform(reinterpret_cast<float*>(src.get()), bytes / 4, 1, 1.0f, stream));
  ASSIGN_OR_RETURN(double copy_ms, EventMedianMs(stream, 2, 10, [&](int) {
                     return CudaStatus(cudaMemcpyAsync(dst.get(), src.get(), bytes,
                                                       cudaMemcpyDeviceToDevice, stream),
                                       "cudaMemcpyAsync");
                   }));
  c.copy_gbps = 2.0 * bytes / (copy_ms * 1e-3) / 1e9;

  const int n = 8192;
  ASSIGN_OR_RETURN(auto a, DeviceBuffer<bf16>::Create(size_t{1} * n * n));
  ASSIGN_OR_RETURN(auto b, DeviceBuffer<bf16>::Create(size_t{1} * n * n));
  ASSIGN_OR_RETURN(auto y, DeviceBuffer<bf16>::Create(size_t{1} * n * n));
  RETURN_IF_ERROR(FillUniform(a.get(), a.size(), 2, 1.0f, stream));
  RETURN_IF_ERROR(FillUniform(b.get(), b.size(), 3, 1.0f, stream));
  GemmParams p;
  p.x = a.get(), p.w = b.get(), p.y = y.get(), p.m = n, p.n = n, p.k = n, p.stream = stream;
  ASSIGN_OR_RETURN(double gemm_ms, EventMedianMs(stream, 3, 10, [&](int) { return gemm.Run(p); }));
  c.gemm_tflops = 2.0 * n * n * n / (gemm_ms * 1e-3) / 1e12;
  return c;
}

}  // namespace moesh::cuda
