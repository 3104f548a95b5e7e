#include "kernels/cuda/stream_flag.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "kernels/cuda/cuda_status.h"

namespace moesh::cuda {
namespace {

struct MemOps {
  PFN_cuStreamWriteValue32_v11070 write = nullptr;
  PFN_cuStreamWaitValue32_v11070 wait = nullptr;
};

absl::StatusOr<MemOps> GetMemOps() {
  static const absl::StatusOr<MemOps> ops = []() -> absl::StatusOr<MemOps> {
    MemOps m;
    ASSIGN_OR_RETURN(
        m.write, DriverEntryPoint<PFN_cuStreamWriteValue32_v11070>("cuStreamWriteValue32", 11070));
    ASSIGN_OR_RETURN(
        m.wait, DriverEntryPoint<PFN_cuStreamWaitValue32_v11070>("cuStreamWaitValue32", 11070));
    return m;
  }();
  return ops;
}

absl::Status DriverStatus(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": CUDA driver error ", static_cast<int>(r)));
}

absl::Status CheckFlag(const uint32_t* flag) {
  if (flag == nullptr || reinterpret_cast<uintptr_t>(flag) % 4 != 0) {
    return absl::InvalidArgumentError("stream flag: need a 4-byte aligned device word");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status StreamWriteFlag(cudaStream_t stream, uint32_t* flag, uint32_t value) {
  RETURN_IF_ERROR(CheckFlag(flag));
  ASSIGN_OR_RETURN(const MemOps ops, GetMemOps());
  return DriverStatus(
      ops.write(reinterpret_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(flag), value,
                CU_STREAM_WRITE_VALUE_DEFAULT),
      "cuStreamWriteValue32");
}

absl::Status StreamWaitFlag(cudaStream_t stream, uint32_t* flag, uint32_t value) {
  RETURN_IF_ERROR(CheckFlag(flag));
  ASSIGN_OR_RETURN(const MemOps ops, GetMemOps());
  return DriverStatus(ops.wait(reinterpret_cast<CUstream>(stream),
                               reinterpret_cast<CUdeviceptr>(flag), value, CU_STREAM_WAIT_VALUE_EQ),
                      "cuStreamWaitValue32");
}

absl::Status SyncWithin(cudaStream_t stream, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e != cudaErrorNotReady) return CudaStatus(e, "cudaStreamQuery");
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("stream still busy after ", absl::FormatDuration(timeout)));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace moesh::cuda
