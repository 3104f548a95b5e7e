// CUDA errors as absl::Status: library code never exits on a CUDA failure.
#ifndef MOESH_KERNELS_CUDA_CUDA_STATUS_H_
#define MOESH_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/status.h"

namespace moesh::cuda {

// OK iff err == cudaSuccess; otherwise INTERNAL naming `what` and carrying
// cudaGetErrorName / cudaGetErrorString.
inline absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")"));
}

// After a kernel launch: the launch's own error, if any.
inline absl::Status LaunchStatus(absl::string_view kernel) {
  return CudaStatus(cudaGetLastError(), kernel);
}

// The CUDA driver function `name` (at `version`, e.g. 12000) as Fn, through
// the runtime's driver entry point (no -lcuda); INTERNAL where this driver
// lacks it. Callers keep the answer (a function-local static).
template <typename Fn>
absl::StatusOr<Fn> DriverEntryPoint(const char* name, int version) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaError_t err = cudaGetDriverEntryPointByVersion(name, &f, version, cudaEnableDefault, &q);
      err != cudaSuccess) {
    return CudaStatus(err, absl::StrCat("cudaGetDriverEntryPointByVersion(", name, ")"));
  }
  if (q != cudaDriverEntryPointSuccess || f == nullptr) {
    return absl::InternalError(absl::StrCat(name, ": not in this driver"));
  }
  return reinterpret_cast<Fn>(f);
}

// Raises kKernel's dynamic shared-memory limit to `bytes` on the current
// device, once per (kernel, device): call it before each launch.
template <auto kKernel>
absl::Status AllowDynamicSmem(int bytes) {
  static std::atomic<uint64_t> done{0};  // bit d: set on device d
  int dev = 0;
  if (cudaError_t err = cudaGetDevice(&dev); err != cudaSuccess)
    return CudaStatus(err, "cudaGetDevice");
  const uint64_t bit = uint64_t{1} << (dev & 63);
  if (done.load(std::memory_order_acquire) & bit) return absl::OkStatus();
  if (cudaError_t err =
          cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      err != cudaSuccess) {
    return CudaStatus(err, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
  }
  done.fetch_or(bit, std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace moesh::cuda

// Returns the Status of a failed CUDA runtime call from the current function.
#define RETURN_IF_CUDA_ERROR(expr) RETURN_IF_ERROR(::moesh::cuda::CudaStatus((expr), #expr))

#endif  // MOESH_KERNELS_CUDA_CUDA_STATUS_H_
