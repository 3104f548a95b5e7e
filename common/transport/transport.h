// The data plane between services: expert dispatch/combine payloads and KV
// handoff. One interface, several implementations chosen per deployment
// (flag `--transport`), never a code fork in the model:
//   inproc — same process, direct calls (colocated mode, tests)
//   grpc   — the DataPlane gRPC service (works everywhere)
//   ucx    — UCX active messages (ucx_transport.h)
//   nccl   — NCCL between GPUs: expert dispatch without the host
//            (nccl_transport.h)
//   cuda_ipc — processes on one node share device memory: expert dispatch
//            without the host (cuda_ipc_transport.h)
#ifndef MOESH_COMMON_TRANSPORT_TRANSPORT_H_
#define MOESH_COMMON_TRANSPORT_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/model/expert_client.h"
#include "common/transport/kv_handoff.h"

namespace moesh {

// Receivers of data-plane messages, implemented by the services.
class DispatchHandler {
 public:
  virtual ~DispatchHandler() = default;
  // out (fp32 [num_tokens, hidden], in the dispatch's memory) overwritten
  // with the weighted sums of the dispatch's pairs served here (and in
  // dispatch.serve, where set). Host dispatches come from every transport
  // (those that carry it as a message check its sizes first:
  // DecodeDispatchRequest, dispatch_wire.h); device ones, in the memory of
  // the server's CUDA device, from nccl and cuda_ipc, ordered by
  // dispatch.ready/done (moe_dispatch.h). A handler refuses memory it does
  // not serve (UNIMPLEMENTED, CheckDispatchMemory).
  virtual absl::Status Dispatch(const MoeDispatch& dispatch, float* out) = 0;
};
class KvHandler {
 public:
  virtual ~KvHandler() = default;
  // Takes a sequence's KV (kv_handoff.h). The transports that carry it as a
  // message check its shape first (DecodePushKv, kv_wire.h).
  virtual absl::Status PushKv(const KvTransfer& transfer) = 0;
};

// The sending side, connected to one peer. Thread-safe.
class DataChannel {
 public:
  virtual ~DataChannel() = default;
  // The memory this channel moves dispatches in: host f32 (every transport),
  // and CUDA device N's bf16 where the transport moves GPU memory (cuda_ipc,
  // nccl: N is this process's device).
  virtual MemoryKinds memory_kinds() const { return {}; }

  // A host dispatch, whole: runs it on the peer and overwrites out (fp32
  // [num_tokens, hidden]) with its answer. UNAVAILABLE (or
  // DEADLINE_EXCEEDED) if the peer is gone; DATA_LOSS if its answer has the
  // wrong size (the peer is not to be trusted: dispatch_wire.h);
  // UNIMPLEMENTED for device memory.
  virtual absl::Status Dispatch(const MoeDispatch& dispatch, float* out) = 0;

  // A posted dispatch: the pending path, for the device memory the channel
  // moves (memory_kinds().device; host dispatches go whole through
  // Dispatch). Post starts it on the peer (once dispatch.ready has fired)
  // and returns; dispatch.serve marks the experts the peer is to run. Then
  // Collect writes the result to `out` (device fp32 [num_tokens, hidden]),
  // or adds it with `accumulate`: enqueued on dispatch.stream, or done on
  // return where that is null. The dispatch's buffers are not to be written
  // before Collect returns. One dispatch in flight per channel
  // (FAILED_PRECONDITION otherwise). UNIMPLEMENTED for other memory.
  virtual absl::Status Post(const MoeDispatch& dispatch);
  virtual absl::Status Collect(float* out, bool accumulate);
  // Channels whose Collect does not wait for the peer's answer (nccl: its
  // answers are read after the step, so no host waits per layer): once the
  // caller's streams are done with the results collected so far, OK if the
  // peer ran every one of them, else why not (those results are not to be
  // used). Others: OK.
  virtual absl::Status CheckCollected() { return absl::OkStatus(); }

  // Hands a sequence's KV to the peer's KvHandler; its answer.
  virtual absl::Status PushKv(const KvTransfer& transfer) = 0;
  virtual const std::string& peer() const = 0;
};

// A channel's Dispatch check: OK for host memory, else UNIMPLEMENTED naming
// the peer (device memory goes through Post and Collect).
absl::Status CheckHostDispatch(const MoeDispatch& dispatch, const std::string& peer);

// A running receiving side of a transport (a listener of its own); the
// registry's plugins start them (transport_registry.h). Stops on destruction.
class DataPlaneServer {
 public:
  virtual ~DataPlaneServer() = default;
  // The bound port.
  virtual int port() const = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual absl::string_view name() const = 0;
  virtual absl::StatusOr<std::unique_ptr<DataChannel>> Connect(const std::string& address) = 0;
};

// A transport whose channel to an address is a `Channel(address)`, made on
// Connect and holding nothing shared (grpc, inproc).
template <typename Channel>
class ChannelTransport final : public Transport {
 public:
  explicit ChannelTransport(absl::string_view name) : name_(name) {}
  absl::string_view name() const override { return name_; }
  absl::StatusOr<std::unique_ptr<DataChannel>> Connect(const std::string& address) override {
    return std::make_unique<Channel>(address);
  }

 private:
  const absl::string_view name_;
};

// The sending side of the transport of that name (transport_registry.h:
// "grpc", "inproc", "ucx", "nccl" or "cuda_ipc"; device transports move
// memory of CUDA device `cuda_device`); INVALID_ARGUMENT naming the choices
// otherwise.
absl::StatusOr<std::unique_ptr<Transport>> MakeTransport(absl::string_view name,
                                                         int cuda_device = 0);

// The in-process registry behind the inproc transport: a service binds its
// handlers to an address; channels to that address call them directly.
// Thread-safe. REQUIRES: handlers outlive their binding.
absl::Status BindInproc(const std::string& address, DispatchHandler* dispatch, KvHandler* kv);
void UnbindInproc(const std::string& address);

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_TRANSPORT_H_
