// One MoE layer's expert dispatch, wherever its buffers lie: the one type the
// model hands an ExpertClient, a DataChannel carries and a DispatchHandler or
// ExpertStage serves. A memory descriptor says where the buffers are (host
// memory, or CUDA device N's) and the hidden states' element type; each party
// states the memory it takes (MemoryKinds) and refuses any other with
// CheckDispatchMemory's error, never by guessing from a transport's name.
//
// Plain data, borrowed pointers; thread-compatible.
#ifndef MOESH_COMMON_MODEL_MOE_DISPATCH_H_
#define MOESH_COMMON_MODEL_MOE_DISPATCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "base/dtype.h"

namespace moesh {

enum class MemoryKind { kHost, kCudaDevice };

// Where a dispatch's buffers lie, and the hidden states' element type. Two
// forms exist: host fp32 (what the CPU model and the wire carry) and CUDA
// device bf16 (a GPU attention worker's buffers, as the GPU experts take them).
struct DispatchMemory {
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;            // kCudaDevice: the CUDA ordinal; -1 for the host
  DType dtype = DType::kF32;  // hidden_states': kF32 (host) or kBF16 (device)

  static DispatchMemory Host() { return {}; }
  static DispatchMemory CudaDevice(int device) {
    return {MemoryKind::kCudaDevice, device, DType::kBF16};
  }
  bool is_host() const { return kind == MemoryKind::kHost; }
  bool operator==(const DispatchMemory& o) const {
    return kind == o.kind && device == o.device && dtype == o.dtype;
  }
  bool operator!=(const DispatchMemory& o) const { return !(*this == o); }
  // "host f32", "cuda:0 bf16" (for messages).
  std::string ToString() const {
    return absl::StrCat(is_host() ? "host" : absl::StrCat("cuda:", device), " ",
                        dtype == DType::kF32    ? "f32"
                        : dtype == DType::kBF16 ? "bf16"
                                                : std::string(DTypeName(dtype)));
  }
};

// The memory a party (a transport's channel, an expert client) takes
// dispatches in: host fp32 always; CUDA device `device`'s bf16 too iff
// device >= 0 (a transport moving GPU memory: nccl, cuda_ipc).
struct MemoryKinds {
  int device = -1;

  bool Takes(const DispatchMemory& m) const {
    return m == DispatchMemory::Host() || (device >= 0 && m == DispatchMemory::CudaDevice(device));
  }
};

// How a host dispatch travels where a transport carries it as a message
// (grpc, ucx, nccl's host calls: common/transport/dispatch_wire.h): its
// hidden states in fp32 (exact), bf16 (rounded to nearest even) or fp8 (e4m3
// with a float32 scale per token per 128 channels: DeepEP's FP8 dispatch),
// and its answer in fp32 or bf16. The sender picks (RemoteExpertClient,
// --dispatch_dtype); the message names its encoding, so any receiver reads
// any. Nothing else reads it: in process (inproc) and in device memory
// (nccl's and cuda_ipc's Post) the buffers move as they are.
enum class WireDType { kF32, kBF16, kFp8 };
struct DispatchWire {
  WireDType hidden = WireDType::kF32;  // kF32, kBF16 or kFp8
  WireDType reply = WireDType::kF32;   // kF32 or kBF16
  bool operator==(const DispatchWire& o) const { return hidden == o.hidden && reply == o.reply; }
};

struct MoeDispatch {
  int layer = 0;
  int num_tokens = 0;
  int hidden = 0;
  int top_k = 0;
  DispatchMemory memory;  // where the three buffers below lie
  // [num_tokens, hidden] of memory.dtype (hidden_f32 / hidden_bf16 read it).
  const void* hidden_states = nullptr;
  const int32_t* topk_ids = nullptr;    // [num_tokens, top_k], in [0, n_routed_experts); -1: skip
  const float* topk_weights = nullptr;  // [num_tokens, top_k]
  DispatchWire wire;                    // host dispatches sent as a message only

  // Host [num_experts = n_routed_experts]: nonzero for the experts whose
  // pairs to run where it goes (the rest are another worker's replicas);
  // null: every hosted expert. Device dispatches only (host ones are split
  // by token instead).
  const uint8_t* serve = nullptr;
  int num_experts = 0;
  // Device dispatches: the caller's CUDA stream and event (cudaStream_t,
  // cudaEvent_t). The inputs are complete once `ready` fires (null:
  // already); the result is delivered on `stream`, ordered after the call
  // that completes the dispatch returns (null: complete on return).
  void* ready = nullptr;
  void* stream = nullptr;
  // ExpertStage::Accumulate of a device dispatch only: a cudaEvent_t to
  // record once `out` is written; the call then returns without waiting for
  // the device (`ready` is then waited for on the device too).
  void* done = nullptr;
  // Instead of `ready` and `done` (ExpertStage::Accumulate of a device
  // dispatch; a cuda_ipc attachment's device words): the inputs are complete
  // once *ready_flag == sync_value, and *done_flag = sync_value is written
  // once `out` is (both 4-byte aligned device words; the call then returns
  // without waiting, as with `done`).
  uint32_t* ready_flag = nullptr;
  uint32_t* done_flag = nullptr;
  uint32_t sync_value = 0;
  // The caller's lane at a GPU expert stage (a transport's attachment or
  // channel): dispatches of one lane run in order, different lanes' may
  // overlap, so one caller's slow or stuck work holds up only its own.
  int lane = 0;

  // REQUIRES: memory.dtype == kF32.
  const float* hidden_f32() const { return static_cast<const float*>(hidden_states); }
  // REQUIRES: memory.dtype == kBF16.
  const uint16_t* hidden_bf16() const { return static_cast<const uint16_t*>(hidden_states); }
};

// OK iff `kinds` takes d's memory; else UNIMPLEMENTED naming `who`, what it
// takes and what came ("the cpu expert stage takes host f32 dispatches, not
// cuda:0 bf16").
inline absl::Status CheckDispatchMemory(const MoeDispatch& d, const MemoryKinds& kinds,
                                        absl::string_view who) {
  if (kinds.Takes(d.memory)) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      who, " takes host f32 dispatches",
      kinds.device >= 0 ? absl::StrCat(" and ", DispatchMemory::CudaDevice(kinds.device).ToString())
                        : "",
      ", not ", d.memory.ToString()));
}

// The (token, expert) pairs of a device dispatch that ran here, for load
// accounting: topk_ids with the pairs not served here as -1.
struct CountedDispatch {
  int layer = -1;
  int num_tokens = 0, top_k = 0;
  std::vector<int32_t> ids;
};

// A dispatch in flight (ExpertClient::Start), of either memory kind.
class PendingDispatch {
 public:
  virtual ~PendingDispatch() = default;
  // Completes the dispatch and returns its status. Call once. Host memory,
  // or device memory without a stream: blocks until the result is in `out`.
  // Device memory with a stream: returns once the result's delivery is
  // enqueued on that stream (work enqueued there afterwards sees it; the
  // host does not wait for the device).
  virtual absl::Status Wait() = 0;
};

}  // namespace moesh

#endif  // MOESH_COMMON_MODEL_MOE_DISPATCH_H_
