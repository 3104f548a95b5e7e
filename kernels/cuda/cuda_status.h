// CUDA errors as absl::Status: library code never exits on a CUDA failure.
#ifndef MOESH_KERNELS_CUDA_CUDA_STATUS_H_
#define MOESH_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
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

}  // namespace moesh::cuda

// Returns the Status of a failed CUDA runtime call from the current function.
#define RETURN_IF_CUDA_ERROR(expr) RETURN_IF_ERROR(::moesh::cuda::CudaStatus((expr), #expr))

#endif  // MOESH_KERNELS_CUDA_CUDA_STATUS_H_
