#include "common/cuda_backend/kv_pool.h"

#include <unistd.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/dtype.h"
#include "base/status.h"
#include "kernels/cuda/model_ops.h"

namespace moesh::cuda {
namespace {

// This process's exported pools, by handle (CUDA maps a handle only in
// other processes): pointer and device.
ABSL_CONST_INIT absl::Mutex local_mu(absl::kConstInit);
std::map<std::string, std::pair<const bf16*, int>>& LocalPools() {
  static auto* pools = new std::map<std::string, std::pair<const bf16*, int>>;
  return *pools;
}

constexpr auto kIdleMapping = std::chrono::seconds(60);

}  // namespace

KvPool::~KvPool() {
  if (!ipc_handle_.empty()) {
    absl::MutexLock lock(&local_mu);
    LocalPools().erase(ipc_handle_);
  }
  for (auto& [handle, m] : mapped_) cudaIpcCloseMemHandle(m.ptr);
}

const std::string& KvPool::ProcessToken() {
  static const std::string* token = [] {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    std::random_device rd;
    return new std::string(
        absl::StrCat(host, ":", getpid(), ":", (static_cast<uint64_t>(rd()) << 32) ^ rd()));
  }();
  return *token;
}

absl::StatusOr<std::string> KvPool::IpcHandle() {
  if (!ipc_handle_.empty()) return ipc_handle_;
  absl::StatusOr<std::string> handle = cuda::IpcMemHandle(storage_.get());
  if (handle.ok()) {
    ipc_handle_ = *std::move(handle);
  } else {  // no CUDA IPC here: a key that only this process resolves
    cudaGetLastError();
    ipc_handle_ =
        absl::StrCat("local:", ProcessToken(), ":", reinterpret_cast<uintptr_t>(storage_.get()));
  }
  int device = 0;
  RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  absl::MutexLock lock(&local_mu);
  LocalPools()[ipc_handle_] = {storage_.get(), device};
  return ipc_handle_;
}

absl::Status KvPool::CopyBlocksFrom(const std::string& src_handle, const std::string& sender,
                                    int src_num_blocks, const std::vector<int32_t>& src_blocks,
                                    const std::vector<int32_t>& dst_blocks, int n,
                                    cudaStream_t stream) {
  if (src_handle.empty() || src_num_blocks < 1 || n < 0 ||
      n > static_cast<int>(src_blocks.size()) || n > static_cast<int>(dst_blocks.size())) {
    return absl::InvalidArgumentError(absl::StrCat("KV copy: a handle of ", src_handle.size(),
                                                   " bytes, ", n, " blocks of ", src_blocks.size(),
                                                   " / ", dst_blocks.size()));
  }
  for (int i = 0; i < n; ++i) {
    if (src_blocks[i] < 0 || src_blocks[i] >= src_num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat("KV copy: source block ", src_blocks[i],
                                                     " outside the pool's ", src_num_blocks));
    }
  }
  if (n == 0) return absl::OkStatus();
  const auto now = std::chrono::steady_clock::now();
  for (auto it = mapped_.begin();
       it != mapped_.end();) {  // a restarted sender leaves its old pool here
    const bool replaced = !sender.empty() && it->second.sender == sender && it->first != src_handle;
    if (replaced || (it->first != src_handle && now - it->second.used > kIdleMapping)) {
      cudaIpcCloseMemHandle(it->second.ptr);
      it = mapped_.erase(it);
    } else {
      ++it;
    }
  }
  int device = 0;
  RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  const bf16* src = nullptr;
  int src_device = device;
  {
    absl::MutexLock lock(&local_mu);
    auto it = LocalPools().find(src_handle);
    if (it != LocalPools().end()) src = it->second.first, src_device = it->second.second;
  }
  if (src != nullptr && src_device != device) {  // this process's pool on another GPU: peer access
    int can = 0;
    RETURN_IF_CUDA_ERROR(cudaDeviceCanAccessPeer(&can, device, src_device));
    if (!can) {
      return absl::FailedPreconditionError(
          absl::StrCat("KV copy: GPU ", device, " cannot read GPU ", src_device, "'s memory"));
    }
    const cudaError_t err = cudaDeviceEnablePeerAccess(src_device, 0);
    if (err != cudaSuccess && err != cudaErrorPeerAccessAlreadyEnabled) RETURN_IF_CUDA_ERROR(err);
    cudaGetLastError();
  }
  if (src == nullptr) {
    if (src_handle.size() != sizeof(cudaIpcMemHandle_t)) {
      return absl::FailedPreconditionError(
          "KV copy: the sender's pool is not exported through CUDA IPC");
    }
    auto it = mapped_.find(src_handle);
    if (it == mapped_.end()) {
      absl::StatusOr<void*> ptr = cuda::OpenIpcMemHandle(src_handle);
      if (!ptr.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "KV copy: cannot map the sender's KV pool (", ptr.status().message(), ")"));
      }
      it = mapped_.emplace(src_handle, Mapped{*ptr, sender, now}).first;
    }
    it->second.used = now;
    src = static_cast<const bf16*>(it->second.ptr);
  }
  if (copy_ids_.size() < 2 * static_cast<size_t>(n)) {
    ASSIGN_OR_RETURN(copy_ids_,
                     DeviceBuffer<int32_t>::Create(2 * static_cast<size_t>(std::max(n, 64))));
  }
  std::vector<int32_t> ids(src_blocks.begin(), src_blocks.begin() + n);
  ids.insert(ids.end(), dst_blocks.begin(), dst_blocks.begin() + n);
  RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(copy_ids_.get(), ids.data(), ids.size() * sizeof(int32_t),
                                       cudaMemcpyHostToDevice, stream));
  CopyKvBlocksParams p;
  p.src = src,
  p.src_layer_elems = static_cast<int64_t>(src_num_blocks) * kKvBlockSize * row_stride_;
  p.dst = storage_.get(),
  p.dst_layer_elems = static_cast<int64_t>(num_blocks_) * kKvBlockSize * row_stride_;
  p.block_elems = static_cast<int64_t>(kKvBlockSize) * row_stride_;
  p.src_blocks = copy_ids_.get(), p.dst_blocks = copy_ids_.get() + n, p.num_blocks = n,
  p.num_layers = num_layers_;
  p.stream = stream;
  RETURN_IF_ERROR(RunCopyKvBlocks(p));
  return CudaStatus(cudaStreamSynchronize(stream),
                    "cudaStreamSynchronize (KV blocks from device memory)");
}

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(int num_layers, const KvRowSpec& row,
                                                       int num_blocks) {
  if (num_layers < 1 || row.width < 1 || num_blocks < 1) {
    return absl::InvalidArgumentError("KvPool: need num_layers, row width, num_blocks >= 1");
  }
  if (row.fp8() && (row.latent < 16 || row.latent % 16 != 0 || row.rope < 0 || row.rope % 2 != 0 ||
                    row.width != row.latent + row.rope)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KvPool: FP8 rows need a latent part that is a multiple of 16 and an even rope part (",
        row.latent, " + ", row.rope, ")"));
  }
  std::unique_ptr<KvPool> pool(new KvPool(num_layers, row, num_blocks));
  ASSIGN_OR_RETURN(pool->storage_,
                   DeviceBuffer<bf16>::Create(static_cast<size_t>(num_layers) * num_blocks *
                                              kKvBlockSize * row.stride()));
  return pool;
}

absl::Status KvPool::CopyRows(int layer, const std::vector<int32_t>& blocks, int first, int n,
                              uint16_t* host, cudaMemcpyKind kind, cudaStream_t stream) const {
  const size_t w = row_stride_;
  for (int i = 0; i < n;) {
    const int pos = first + i, in_block = std::min(n - i, kKvBlockSize - pos % kKvBlockSize);
    bf16* dev =
        this->layer(layer) +
        (static_cast<size_t>(blocks[pos / kKvBlockSize]) * kKvBlockSize + pos % kKvBlockSize) * w;
    uint16_t* h = host + static_cast<size_t>(i) * w;
    void* dst = kind == cudaMemcpyHostToDevice ? static_cast<void*>(dev) : static_cast<void*>(h);
    const void* src = kind == cudaMemcpyHostToDevice ? static_cast<const void*>(h)
                                                     : static_cast<const void*>(dev);
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, src, in_block * w * sizeof(bf16), kind, stream));
    i += in_block;
  }
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize (KV rows)");
}

absl::Status KvPool::WriteRows(int layer, const std::vector<int32_t>& blocks, int first,
                               const float* rows, int n, cudaStream_t stream) {
  std::vector<uint16_t> staging(static_cast<size_t>(n) * row_stride_);
  if (row_.fp8()) {
    const cpu::Fp8KvRowLayout layout{row_.latent, row_.rope};
    for (int i = 0; i < n; ++i) {
      cpu::PackFp8KvRow(
          rows + static_cast<size_t>(i) * row_.width, layout,
          reinterpret_cast<uint8_t*>(staging.data() + static_cast<size_t>(i) * row_stride_));
    }
  } else {
    for (size_t i = 0; i < staging.size(); ++i) staging[i] = F32ToBf16(rows[i]);
  }
  return CopyRows(layer, blocks, first, n, staging.data(), cudaMemcpyHostToDevice, stream);
}

absl::Status KvPool::ReadRows(int layer, const std::vector<int32_t>& blocks, int first, int n,
                              float* rows, cudaStream_t stream) const {
  std::vector<uint16_t> staging(static_cast<size_t>(n) * row_stride_);
  RETURN_IF_ERROR(
      CopyRows(layer, blocks, first, n, staging.data(), cudaMemcpyDeviceToHost, stream));
  if (row_.fp8()) {
    const cpu::Fp8KvRowLayout layout{row_.latent, row_.rope};
    for (int i = 0; i < n; ++i) {
      cpu::UnpackFp8KvRow(
          reinterpret_cast<const uint8_t*>(staging.data() + static_cast<size_t>(i) * row_stride_),
          layout, rows + static_cast<size_t>(i) * row_.width);
    }
  } else {
    for (size_t i = 0; i < staging.size(); ++i) rows[i] = Bf16ToF32(staging[i]);
  }
  return absl::OkStatus();
}

}  // namespace moesh::cuda
