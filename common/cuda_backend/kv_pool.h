// The paged latent KV cache on the device: for every layer, num_blocks blocks
// of kKvBlockSize rows [kv_lora_rank latent | rope key], bf16 or FP8
// (KvRowSpec), in one cudaMalloc (never managed memory). A block id names the same block in every
// layer. Storage only: which sequence holds which block (and the prefix
// cache's sharing) is the KvStore's (kv_store.h).
//
// Not thread-safe: one owner (the CudaModel) at a time.
#ifndef MOESH_COMMON_CUDA_BACKEND_KV_POOL_H_
#define MOESH_COMMON_CUDA_BACKEND_KV_POOL_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/config.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/params.h"

namespace moesh::cuda {

// A pool's row: `width` values (what WriteRows and ReadRows exchange, as
// float32), stored as bf16, or (kFp8, --kv_cache_dtype fp8) as
// cpu::Fp8KvRowLayout{latent, rope}'s bytes, width == latent + rope; `rope`
// is then every bf16 value after the latent (V3.2: the rope key and the index
// key after it).
struct KvRowSpec {
  int width = 0;
  KvCacheDtype dtype = KvCacheDtype::kBf16;
  int latent = 0, rope = 0;  // kFp8's layout

  static KvRowSpec Bf16(int width) { return {width, KvCacheDtype::kBf16, 0, 0}; }
  static KvRowSpec Fp8(int latent, int rope) {
    return {latent + rope, KvCacheDtype::kFp8, latent, rope};
  }
  bool fp8() const { return dtype == KvCacheDtype::kFp8; }
  // The 2-byte units a row takes: the kernels' row stride.
  int stride() const { return fp8() ? cpu::Fp8KvRowLayout{latent, rope}.bytes() / 2 : width; }
  bool operator==(const KvRowSpec& o) const {
    return width == o.width && dtype == o.dtype && latent == o.latent && rope == o.rope;
  }
};

class KvPool {
 public:
  // Bytes of one block across all layers.
  static size_t BlockBytes(int num_layers, const KvRowSpec& row) {
    return static_cast<size_t>(num_layers) * kKvBlockSize * row.stride() * sizeof(bf16);
  }
  // REQUIRES: num_blocks >= 1, row.width >= 1; an FP8 row's latent a
  // positive multiple of 16 and its rope even (else INVALID_ARGUMENT).
  // RESOURCE_EXHAUSTED if the device lacks memory.
  static absl::StatusOr<std::unique_ptr<KvPool>> Create(int num_layers, const KvRowSpec& row,
                                                        int num_blocks);

  int num_layers() const { return num_layers_; }
  const KvRowSpec& row() const { return row_; }
  int row_stride() const { return row_stride_; }  // 2-byte units
  int num_blocks() const { return num_blocks_; }
  size_t bytes() const { return storage_.bytes(); }
  // Layer l's blocks: [num_blocks, kKvBlockSize, row_stride].
  bf16* layer(int l) const {
    return storage_.get() + static_cast<size_t>(l) * num_blocks_ * kKvBlockSize * row_stride_;
  }

  // Rows [first, first + n) of a sequence with block table `blocks` in
  // `layer`, as float32 [n, row().width] on the host (bf16 or FP8 here, as
  // cpu::PackFp8KvRow packs them), synchronously on `stream`. REQUIRES: the
  // blocks cover the rows.
  absl::Status WriteRows(int layer, const std::vector<int32_t>& blocks, int first,
                         const float* rows, int n, cudaStream_t stream);
  absl::Status ReadRows(int layer, const std::vector<int32_t>& blocks, int first, int n,
                        float* rows, cudaStream_t stream) const;

  // The KV handoff in device memory (cuda_ipc). IpcHandle: this pool's
  // storage as cudaIpcMemHandle_t bytes (made once; this process's own
  // pools are also found by handle, since CUDA does not map a handle in the
  // process that made it). CopyBlocksFrom: copies the first `n` blocks of
  // `src_blocks` of another pool with this one's geometry and `src_num_blocks`
  // blocks (mapped by handle: another process's, on this or a peer GPU) into
  // `dst_blocks`, every layer, synchronously on `stream`. INVALID_ARGUMENT for
  // a malformed handle or block ids out of range; FAILED_PRECONDITION if this
  // process cannot map or read it (no CUDA IPC, the process is gone, no peer
  // access). Mappings idle for a minute are closed.
  // Where CUDA IPC is unavailable the handle is a key only this process
  // resolves. `sender` names the exporting process (ProcessToken()): a new
  // handle from a sender closes the mapping of its previous one (a restarted
  // prefill worker's old pool is not kept alive here).
  absl::StatusOr<std::string> IpcHandle();
  absl::Status CopyBlocksFrom(const std::string& src_handle, const std::string& sender,
                              int src_num_blocks, const std::vector<int32_t>& src_blocks,
                              const std::vector<int32_t>& dst_blocks, int n, cudaStream_t stream);
  // This process, uniquely on this node (host, pid and a random number).
  static const std::string& ProcessToken();
  ~KvPool();

 private:
  KvPool(int num_layers, const KvRowSpec& row, int num_blocks)
      : num_layers_(num_layers), row_(row), row_stride_(row.stride()), num_blocks_(num_blocks) {}
  // One cudaMemcpyAsync per run of rows inside a block, between the pool and
  // host rows as stored [n, row_stride].
  absl::Status CopyRows(int layer, const std::vector<int32_t>& blocks, int first, int n,
                        uint16_t* host, cudaMemcpyKind kind, cudaStream_t stream) const;

  const int num_layers_;
  const KvRowSpec row_;
  const int row_stride_, num_blocks_;
  DeviceBuffer<bf16> storage_;
  std::string ipc_handle_;  // set by IpcHandle()
  // Other pools mapped by CopyBlocksFrom: handle -> (pointer, last use).
  struct Mapped {
    void* ptr = nullptr;
    std::string sender;
    std::chrono::steady_clock::time_point used;
  };
  std::map<std::string, Mapped> mapped_;
  DeviceBuffer<int32_t> copy_ids_;  // [2, *]: source and destination block ids of a copy
};

}  // namespace moesh::cuda

#endif  // MOESH_COMMON_CUDA_BACKEND_KV_POOL_H_
