#include "kernels/cuda/model/kv_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status.h"

namespace moesh::cuda {

absl::StatusOr<std::unique_ptr<KvPool>> KvPool::Create(int num_layers, int row_width, int num_blocks) {
  if (num_layers < 1 || row_width < 1 || num_blocks < 1) {
    return absl::InvalidArgumentError("KvPool: need num_layers, row_width, num_blocks >= 1");
  }
  std::unique_ptr<KvPool> pool(new KvPool(num_layers, row_width, num_blocks));
  ASSIGN_OR_RETURN(pool->storage_,
                   DeviceBuffer<bf16>::Create(static_cast<size_t>(num_layers) * num_blocks * kKvBlockSize * row_width));
  pool->free_.reserve(num_blocks);
  for (int b = num_blocks - 1; b >= 0; --b) pool->free_.push_back(b);
  return pool;
}

absl::Status KvPool::Allocate(int n, std::vector<int32_t>* blocks) {
  if (n > static_cast<int>(free_.size())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KV cache: ", n, " blocks wanted, ", free_.size(), " of ", num_blocks_, " free"));
  }
  for (int i = 0; i < n; ++i) {
    blocks->push_back(free_.back());
    free_.pop_back();
  }
  return absl::OkStatus();
}

void KvPool::Release(const std::vector<int32_t>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) free_.push_back(*it);
}

absl::Status KvPool::CopyRows(int layer, const std::vector<int32_t>& blocks, int first, int n, uint16_t* host,
                              cudaMemcpyKind kind, cudaStream_t stream) const {
  const size_t w = row_width_;
  for (int i = 0; i < n;) {
    const int pos = first + i, in_block = std::min(n - i, kKvBlockSize - pos % kKvBlockSize);
    bf16* dev = this->layer(layer) +
                (static_cast<size_t>(blocks[pos / kKvBlockSize]) * kKvBlockSize + pos % kKvBlockSize) * w;
    uint16_t* h = host + static_cast<size_t>(i) * w;
    void* dst = kind == cudaMemcpyHostToDevice ? static_cast<void*>(dev) : static_cast<void*>(h);
    const void* src = kind == cudaMemcpyHostToDevice ? static_cast<const void*>(h) : static_cast<const void*>(dev);
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, src, in_block * w * sizeof(bf16), kind, stream));
    i += in_block;
  }
  return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize (KV rows)");
}

absl::Status KvPool::WriteRows(int layer, const std::vector<int32_t>& blocks, int first, const float* rows, int n,
                               cudaStream_t stream) {
  std::vector<uint16_t> staging(static_cast<size_t>(n) * row_width_);
  for (size_t i = 0; i < staging.size(); ++i) staging[i] = F32ToBf16(rows[i]);
  return CopyRows(layer, blocks, first, n, staging.data(), cudaMemcpyHostToDevice, stream);
}

absl::Status KvPool::ReadRows(int layer, const std::vector<int32_t>& blocks, int first, int n, float* rows,
                              cudaStream_t stream) const {
  std::vector<uint16_t> staging(static_cast<size_t>(n) * row_width_);
  RETURN_IF_ERROR(CopyRows(layer, blocks, first, n, staging.data(), cudaMemcpyDeviceToHost, stream));
  for (size_t i = 0; i < staging.size(); ++i) rows[i] = Bf16ToF32(staging[i]);
  return absl::OkStatus();
}

}  // namespace moesh::cuda
