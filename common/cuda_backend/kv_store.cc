#include "common/cuda_backend/kv_store.h"

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace moesh::cuda {

absl::StatusOr<int> KvStore::Add(int reserve_tokens, absl::Span<const int32_t> prefix) {
  if (reserve_tokens < 0 || reserve_tokens > max_tokens_) {
    return absl::InvalidArgumentError(absl::StrCat("CudaModel: cannot reserve ", reserve_tokens,
                                                   " tokens; max_model_len is ", max_tokens_));
  }
  KvBlockRun run;
  if (prefix.empty()) {  // exactly the blocks asked for (none for an empty sequence)
    RETURN_IF_ERROR(blocks_.Take(blocks_.BlocksFor(reserve_tokens), &run.blocks));
  } else {
    ASSIGN_OR_RETURN(run, blocks_.Allocate(reserve_tokens, prefix));
  }
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
  seqs_[id].length = run.cached_tokens;
  seqs_[id].blocks = std::move(run.blocks);
  seqs_[id].hashes = std::move(run.hashes);
  return id;
}

absl::Status KvStore::Release(int seq) {
  RETURN_IF_ERROR(Length(seq).status());
  blocks_.Free(seqs_[seq].blocks);
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
  const int need = blocks_.BlocksFor(tokens) - static_cast<int>(s->blocks.size());
  return need > 0 ? blocks_.Take(need, &s->blocks) : absl::OkStatus();
}

void KvStore::Publish(int seq, absl::Span<const int32_t> tokens) {
  Sequence& s = seqs_[seq];
  blocks_.PublishPrefix(s.blocks, s.length, tokens, &s.hashes);
}

}  // namespace moesh::cuda
