// The MLA latent KV cache of a sequence: per layer, one row per token,
// [kv_lora_rank normalised latent | qk_rope_head_dim roped key].
//
// KvSequence is what the forward pass reads and appends to. Two homes for the
// rows: SequenceKvCache (contiguous vectors; the offline engine's and tests'
// cache) and, in paged_kv_cache.h, sequences of fixed-size blocks from a
// shared pool (the serving engine's). Not thread-safe; one owner at a time.
#ifndef MOESH_COMMON_MODEL_KV_CACHE_H_
#define MOESH_COMMON_MODEL_KV_CACHE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace moesh {

struct ModelConfig;

// Where a device-resident sequence's rows lie, for a device-to-device copy
// by another process on this node (the KV handoff over cuda_ipc): the
// sender's paged pool, [num_layers][num_blocks][block_size] rows of
// row_bytes, as a CUDA IPC memory handle, and the sequence's blocks in token
// order.
struct DeviceKvBlocks {
  std::string pool_handle;  // cudaIpcMemHandle_t bytes
  int device = -1;
  int num_blocks = 0;
  int block_size = 0;
  std::vector<int32_t> blocks;
  std::string sender;  // the exporting process: a new handle from it retires the old one's mapping
  // Bytes of one of the pool's rows: its format (bf16 rows of the model's
  // width, or FP8 ones, --kv_cache_dtype); the receiver's must be the same.
  int row_bytes = 0;
};

// How a cache holds its rows. Native: as computed (float32 on the host).
// FP8 (--kv_cache_dtype fp8): FlashMLA's FP8 layout over [latent | rope]
// (kernels/cpu/fp8.h, RoundTripFp8KvRow): the rows read back are those the
// FP8 cache gives, the reference of a device's FP8 cache.
struct KvRowFormat {
  // FP8 over an MLA model's rows: its kv_lora_rank latent, qk_rope_head_dim rope.
  static KvRowFormat Fp8(const ModelConfig& config);

  int fp8_latent = 0;  // > 0: FP8, the latent part's width
  int fp8_rope = 0;    // and its rope part's; the rest of a row stays as it is
  bool fp8() const { return fp8_latent > 0; }
  // rows[n, width] as the cache stores them, in place.
  void Apply(float* rows, int n, int width) const;
};

class KvSequence {
 public:
  virtual ~KvSequence() = default;
  virtual int row_width() const = 0;
  // Tokens whose rows every layer holds.
  virtual int length() const = 0;
  virtual int num_rows(int layer) const = 0;
  // Tokens the sequence can hold without allocating (INT32_MAX if unbounded).
  virtual int capacity() const = 0;
  // Leading tokens whose rows came from a prefix cache when the sequence was
  // made (shared with other sequences, read-only; length() starts there).
  virtual int cached_tokens() const { return 0; }
  // The sequence's first tokens are `tokens` (as far as its rows go): its
  // caches's prefix cache may share the full blocks of rows it holds for
  // them with later sequences. Rows must be those of exactly these tokens.
  // Nothing for caches without a prefix cache.
  virtual void PublishPrefix(absl::Span<const int32_t> tokens) { (void)tokens; }
  // Makes capacity() at least `tokens`, taking the blocks now (a serving
  // engine grows a sequence as it decodes instead of holding its longest
  // length from the start). RESOURCE_EXHAUSTED, taking nothing, if the pool
  // lacks them; INVALID_ARGUMENT beyond the backend's context limit. This
  // default is for caches that cannot grow: OK iff tokens <= capacity().
  virtual absl::Status Reserve(int tokens) {
    if (tokens <= capacity()) return absl::OkStatus();
    return absl::ResourceExhaustedError("this KV cache cannot grow past its capacity");
  }
  // Appends src[n, row_width] to `layer`. Layers are appended in order for the
  // same tokens; the call for the last layer advances length().
  // REQUIRES: num_rows(layer) + n <= capacity().
  virtual void AppendRows(int layer, const float* src, int n) = 0;
  // The rows of `layer` as one contiguous [num_rows(layer), row_width] array;
  // may gather into *scratch and point there.
  virtual const float* Rows(int layer, std::vector<float>* scratch) const = 0;
  // Not OK once moving rows in or out failed (a device error behind
  // AppendRows or Rows, whose results are then not to be used). Host caches
  // never fail.
  virtual absl::Status status() const { return absl::OkStatus(); }
  // True iff every value Rows returns is a bfloat16 (a bf16 cache on a
  // device): the KV handoff then sends them as bf16, exactly.
  virtual bool bf16_rows() const { return false; }
  // Device-resident caches: where the rows lie (valid while this sequence
  // lives and is not appended to). UNIMPLEMENTED for others.
  virtual absl::StatusOr<DeviceKvBlocks> DeviceBlocks() const {
    return absl::UnimplementedError("this KV cache is not in exportable device memory");
  }
  // Device-resident caches holding only their cached_tokens() so far:
  // copies the rest of `length` tokens of every layer from another
  // sequence's DeviceBlocks (the blocks past the cached ones: a prefix cache
  // shares whole blocks), device to device, returning when the copy is done.
  // UNIMPLEMENTED for others; INVALID_ARGUMENT if the geometry differs or
  // length does not pass the cached tokens; FAILED_PRECONDITION if the memory
  // cannot be mapped here (the sender may then hand the rows over through
  // the host).
  virtual absl::Status AppendDeviceBlocks(const DeviceKvBlocks& src, int length) {
    (void)src, (void)length;
    return absl::UnimplementedError("this KV cache cannot take rows from device memory");
  }
};

// Rows in one growable vector per layer.
class SequenceKvCache : public KvSequence {
 public:
  SequenceKvCache(int num_layers, int row_width, KvRowFormat format = {})
      : row_width_(row_width), format_(format), layers_(num_layers) {}

  int row_width() const override { return row_width_; }
  int length() const override { return length_; }
  int num_rows(int layer) const override {
    return static_cast<int>(layers_[layer].size()) / row_width_;
  }
  int capacity() const override { return INT32_MAX; }
  void AppendRows(int layer, const float* src, int n) override;
  const float* Rows(int layer, std::vector<float>*) const override { return layers_[layer].data(); }
  const float* rows(int layer) const { return layers_[layer].data(); }

  // Drops every token at index >= n.
  void Truncate(int n);

 private:
  const int row_width_;
  const KvRowFormat format_;
  int length_ = 0;
  std::vector<std::vector<float>> layers_;
};

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_KV_CACHE_H_
