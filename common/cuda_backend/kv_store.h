// The model's paged KV cache as sequences: the device pool (KvPool, the
// rows) and, on the host, the blocks' bookkeeping (KvBlockAllocator: who
// holds which block, and the prefix cache that shares full blocks between
// sequences whose tokens begin alike) and each sequence's length and block
// table. Sequences hold their blocks until released; blocks are added as a
// sequence grows (Cover). A sequence never writes into a block it shares:
// shared blocks are full, and a sequence starting with them writes from the
// next block on.
//
// Not thread-safe: one owner (the CudaModel) at a time.
#ifndef MOESH_COMMON_CUDA_BACKEND_KV_STORE_H_
#define MOESH_COMMON_CUDA_BACKEND_KV_STORE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cuda_backend/kv_pool.h"
#include "common/engine/kv_block_allocator.h"

namespace moesh::cuda {

class KvStore {
 public:
  struct Sequence {
    bool live = false;
    int length = 0;                // tokens whose rows are in the cache
    std::vector<int32_t> blocks;   // covers at least `length` rows
    std::vector<uint64_t> hashes;  // the leading blocks' hashes, matched or published
  };

  // `max_tokens`: the longest a sequence may grow (max_model_len). With
  // `prefix_cache`, full blocks are published (Publish) and shared (Add's
  // prefix).
  KvStore(std::unique_ptr<KvPool> pool, int max_tokens, bool prefix_cache)
      : pool_(std::move(pool)),
        max_tokens_(max_tokens),
        blocks_(kKvBlockSize, pool_->num_blocks(), prefix_cache) {}

  KvPool& pool() const { return *pool_; }
  // Free blocks, the prefix cache's counters and summary.
  const KvBlockAllocator& blocks() const { return blocks_; }

  // A new sequence holding the blocks of `reserve_tokens` tokens; where the
  // prefix cache holds the leading full blocks of `prefix`, it starts with
  // them (its length: their rows, at most prefix.size() - 1).
  // INVALID_ARGUMENT beyond max_tokens; RESOURCE_EXHAUSTED (adding nothing)
  // if the blocks are not free.
  absl::StatusOr<int> Add(int reserve_tokens, absl::Span<const int32_t> prefix = {});
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
  // Publishes the sequence's full blocks within its length and `tokens` (the
  // tokens of its rows) to the prefix cache. REQUIRES: Length(seq).ok(); the
  // rows' writes are enqueued (they are read after them, on the same stream).
  void Publish(int seq, absl::Span<const int32_t> tokens);

 private:
  const std::unique_ptr<KvPool> pool_;
  const int max_tokens_;
  KvBlockAllocator blocks_;
  std::vector<Sequence> seqs_;
  std::vector<int> free_ids_;
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_KV_STORE_H_
