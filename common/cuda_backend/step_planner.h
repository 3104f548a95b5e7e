// A step's tokens laid out for the forward pass: validation against the
// sequences in the KV store, the cut into passes (StepBatch) that fit the
// scratch rows, decode batches padded to a CUDA-graph bucket, and the upload
// of a pass's inputs to device buffers at fixed addresses (graphs read them).
//
// Not thread-safe: its model's caller's thread, on its model's stream.
#ifndef MOESH_COMMON_CUDA_BACKEND_STEP_PLANNER_H_
#define MOESH_COMMON_CUDA_BACKEND_STEP_PLANNER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/cuda_backend/kv_store.h"
#include "kernels/cuda/device.h"

namespace moesh::cuda {

// New tokens of one sequence for a step.
struct SequenceTokens {
  int seq = -1;                      // from CudaModel::AddSequence
  absl::Span<const int32_t> tokens;  // appended after the cached prefix; not empty
};

// One forward pass's host-side inputs.
struct StepBatch {
  int num_tokens = 0;  // T, including padding rows
  int num_rows = 0;    // head rows (sequences), including padding
  std::vector<int32_t> tokens, positions, slots, seq_lens, head_rows, block_table;
  int max_seq_len = 0;
  bool decode = false;   // one token per sequence, padded to a bucket
  int real_tokens = -1;  // decode: the rows before the padding; -1: num_tokens
  // Segments (runs of one sequence's tokens): each one's last row and its
  // first token's position (V4's compressed entries).
  std::vector<int32_t> seg_last, seg_from;
};

// The uploaded pass on the device: [max_tokens] per token, [max_rows] per
// head row and segment, [max_tokens, max_blocks_per_seq] block table.
struct StepInputs {
  int32_t *tokens = nullptr, *positions = nullptr, *slots = nullptr, *seq_lens = nullptr;
  int32_t *head_rows = nullptr, *block_table = nullptr, *seg_last = nullptr, *seg_from = nullptr;
  int max_blocks_per_seq = 0;
};

struct StepLimits {
  int max_tokens = 0;           // scratch rows: the most tokens of one pass
  int max_rows = 0;             // sequences per step (max_num_seqs)
  int max_tokens_per_step = 0;  // a prefill pass's tokens
  int max_model_len = 0;
  int vocab_size = 0;
};

class StepPlanner {
 public:
  static absl::StatusOr<std::unique_ptr<StepPlanner>> Create(const StepLimits& limits);
  StepPlanner(const StepPlanner&) = delete;
  StepPlanner& operator=(const StepPlanner&) = delete;

  // Validates the step against `store`, allocates its cache blocks and lays
  // out its tokens: one padded decode pass, or prefill passes of at most
  // max_tokens_per_step tokens. order[r] is the step's sequence of head row r
  // (over all passes). INVALID_ARGUMENT for unknown or repeated sequences,
  // empty or out-of-vocabulary tokens, too many sequences, a sequence beyond
  // max_model_len; RESOURCE_EXHAUSTED if the pool lacks blocks.
  absl::Status Plan(absl::Span<const SequenceTokens> seqs, KvStore* store,
                    std::vector<StepBatch>* passes, std::vector<int>* order) const;
  // Copies `b` into the device inputs on `stream` (pinned staging; the
  // staging is reused by the next Upload, after this stream's copies); its
  // segments too iff `segments` (the layer stack reads them).
  absl::Status Upload(const StepBatch& b, cudaStream_t stream, bool segments);

  const StepInputs& inputs() const { return inputs_; }
  // The decode batch sizes graphs are captured for: powers of two, then max_rows.
  const std::vector<int>& buckets() const { return buckets_; }
  int Bucket(int batch) const;
  const StepLimits& limits() const { return limits_; }
  int max_blocks_per_seq() const { return inputs_.max_blocks_per_seq; }

 private:
  explicit StepPlanner(const StepLimits& limits) : limits_(limits) {}

  const StepLimits limits_;
  std::vector<int> buckets_;
  DeviceBuffer<int32_t> tokens_, positions_, slots_, seq_lens_, head_rows_, block_table_, seg_last_,
      seg_from_;
  PinnedBuffer<int32_t> staging_;
  StepInputs inputs_;
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_STEP_PLANNER_H_
