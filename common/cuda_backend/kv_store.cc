#include "common/cuda_backend/kv_store.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace moesh::cuda {

absl::StatusOr<int> KvStore::Add(int reserve_tokens) {
  if (reserve_tokens < 0 || reserve_tokens > max_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("CudaModel: cannot reserve ", reserve_tokens,
                                                   " tokens; max_model_len is ", max_tokens_));
  }
  std::vector<int32_t> blocks;
  RETURN_IF_ERROR(pool_->Allocate((reserve_tokens + kKvBlockSize - 1) / kKvBlockSize, &blocks));
  int id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<int>(seqs_.size());
    seqs_.emplace_back();
  }
  seqs_[id] = Sequence{};
  seqs_[id].live = true;
  seqs_[id].blocks = std::move(blocks);
  return id;
}

absl::Status KvStore::Release(int seq) {
  RETURN_IF_ERROR(Length(seq).status());
  pool_->Release(seqs_[seq].blocks);
  seqs_[seq] = Sequence{};
  free_ids_.push_back(seq);
  return absl::OkStatus();
}

absl::StatusOr<int> KvStore::Length(int seq) const {
  if (seq < 0 || seq >= static_cast<int>(seqs_.size()) || !seqs_[seq].live) {
    return absl::InvalidArgumentError(absl::StrCat("CudaModel: no sequence ", seq));
  }
  return seqs_[seq].length;
}

absl::Status KvStore::Cover(Sequence* s, int tokens) {
  const int need = (tokens + kKvBlockSize - 1) / kKvBlockSize - static_cast<int>(s->blocks.size());
  if (need > 0) RETURN_IF_ERROR(pool_->Allocate(need, &s->blocks));
  return absl::OkStatus();
}

}  // namespace moesh::cuda
