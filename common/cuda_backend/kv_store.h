// The model's paged KV cache as sequences: the device pool (KvPool) and, on
// the host, each sequence's length and block table. Sequences own their
// blocks until released; blocks are added as a sequence grows (Cover).
//
// Not thread-safe: one owner (the CudaModel) at a time.
#ifndef MOESH_COMMON_CUDA_BACKEND_KV_STORE_H_
#define MOESH_COMMON_CUDA_BACKEND_KV_STORE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cuda_backend/kv_pool.h"

namespace moesh::cuda {

class KvStore {
 public:
  struct Sequence {
    bool live = false;
    int length = 0;               // tokens whose rows are in the cache
    std::vector<int32_t> blocks;  // covers at least `length` rows
  };

  // `max_tokens`: the longest a sequence may grow (max_model_len).
  KvStore(std::unique_ptr<KvPool> pool, int max_tokens)
      : pool_(std::move(pool)), max_tokens_(max_tokens) {}

  KvPool& pool() const { return *pool_; }

  // A new sequence holding the blocks of `reserve_tokens` tokens.
  // INVALID_ARGUMENT beyond max_tokens; RESOURCE_EXHAUSTED (adding nothing)
  // if the blocks are not free.
  absl::StatusOr<int> Add(int reserve_tokens);
  // Gives the sequence's blocks back. INVALID_ARGUMENT for no such sequence.
  absl::Status Release(int seq);
  // INVALID_ARGUMENT for no such sequence ("CudaModel: no sequence N").
  absl::StatusOr<int> Length(int seq) const;
  // REQUIRES: Length(seq).ok().
  Sequence& at(int seq) { return seqs_[seq]; }
  const Sequence& at(int seq) const { return seqs_[seq]; }
  // Allocates blocks so that `s` covers rows [0, tokens). RESOURCE_EXHAUSTED
  // (allocating none) if they are not free.
  absl::Status Cover(Sequence* s, int tokens);

 private:
  const std::unique_ptr<KvPool> pool_;
  const int max_tokens_;
  std::vector<Sequence> seqs_;
  std::vector<int> free_ids_;
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_KV_STORE_H_
