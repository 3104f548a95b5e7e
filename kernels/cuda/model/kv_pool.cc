#include "kernels/cuda/model/kv_pool.h"

#include "absl/strings/str_cat.h"

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

}  // namespace moesh::cuda
