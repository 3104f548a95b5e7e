#include "common/transport/nccl_link.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace moesh {
namespace {

absl::Status NcclError(const char* what, ncclResult_t r) {
  return absl::UnavailableError(absl::StrCat("NCCL ", what, ": ", ncclGetErrorString(r)));
}

}  // namespace

absl::StatusOr<ncclUniqueId> NewNcclUniqueId() {
  ncclUniqueId id;
  const ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess) return NcclError("unique id", r);
  return id;
}

std::string UniqueIdToBytes(const ncclUniqueId& id) {
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::StatusOr<ncclUniqueId> UniqueIdFromBytes(const std::string& bytes) {
  if (bytes.size() != sizeof(ncclUniqueId)) {
    return absl::InvalidArgumentError(
        absl::StrCat("an NCCL unique id is ", sizeof(ncclUniqueId), " bytes, got ", bytes.size()));
  }
  ncclUniqueId id;
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

absl::StatusOr<std::unique_ptr<NcclLink>> NcclLink::Create(const ncclUniqueId& id, int rank, int device) {
  if (rank != 0 && rank != 1) return absl::InvalidArgumentError(absl::StrCat("rank must be 0 or 1, got ", rank));
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return absl::FailedPreconditionError("NCCL link: no CUDA device on this machine");
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " does not exist (", count, " present)"));
  }
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("cudaSetDevice: ", cudaGetErrorString(e)));
  }
  ncclComm_t comm;
  const ncclResult_t r = ncclCommInitRank(&comm, /*nranks=*/2, id, rank);
  if (r != ncclSuccess) return NcclError("communicator init", r);
  return std::unique_ptr<NcclLink>(new NcclLink(comm, rank, device));
}

NcclLink::~NcclLink() {
  cudaSetDevice(device_);
  ncclCommDestroy(comm_);
}

absl::Status NcclLink::Send(const void* buf, size_t bytes, cudaStream_t stream) {
  cudaSetDevice(device_);
  const ncclResult_t r = ncclSend(buf, bytes, ncclUint8, 1 - rank_, comm_, stream);
  return r == ncclSuccess ? absl::OkStatus() : NcclError("send", r);
}

absl::Status NcclLink::Recv(void* buf, size_t bytes, cudaStream_t stream) {
  cudaSetDevice(device_);
  const ncclResult_t r = ncclRecv(buf, bytes, ncclUint8, 1 - rank_, comm_, stream);
  return r == ncclSuccess ? absl::OkStatus() : NcclError("recv", r);
}

}  // namespace moesh
