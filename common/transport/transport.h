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
  // out (fp32 [num_tokens, hidden]) overwritten with the weighted sums of the
  // dispatch's pairs served here. The transports that carry it as a message
  // check its sizes first (DecodeDispatchRequest, dispatch_wire.h).
  virtual absl::Status Dispatch(const MoeDispatch& dispatch, float* out) = 0;
};
// Device-resident dispatch (cuda_ipc): the expert worker computes from and
// into device memory on its GPU (common/model/expert_client.h).
class DeviceDispatchHandler {
 public:
  virtual ~DeviceDispatchHandler() = default;
  // out (device fp32 [num_tokens, hidden]) overwritten; returns when done.
  virtual absl::Status DispatchOnDevice(const DeviceMoeDispatch& dispatch, float* out) = 0;
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
  // Runs the dispatch on the peer: out (fp32 [num_tokens, hidden]) is
  // overwritten with its answer. UNAVAILABLE (or DEADLINE_EXCEEDED) if the
  // peer is gone; DATA_LOSS if its answer has the wrong size (the peer is
  // not to be trusted: dispatch_wire.h).
  virtual absl::Status Dispatch(const MoeDispatch& dispatch, float* out) = 0;
  // Hands a sequence's KV to the peer's KvHandler; its answer.
  virtual absl::Status PushKv(const KvTransfer& transfer) = 0;
  virtual const std::string& peer() const = 0;

  // Device-resident dispatch, where the transport moves GPU memory
  // (cuda_ipc, nccl): >= 0 is the CUDA device whose buffers PostOnDevice takes.
  virtual int dispatch_device() const { return -1; }
  // Starts the dispatch on the peer (once dispatch.ready has fired) and
  // returns; dispatch.serve (host, [n_routed_experts]) marks the experts the
  // peer is to run. Then CollectOnDevice writes the result to `out` (device
  // fp32 [num_tokens, hidden]), or adds it with `accumulate`: enqueued on
  // dispatch.stream, or done on return where that is null. The dispatch's
  // buffers are not to be written before CollectOnDevice returns. One
  // dispatch in flight per channel.
  virtual absl::Status PostOnDevice(const DeviceMoeDispatch& dispatch);
  virtual absl::Status CollectOnDevice(float* out, bool accumulate);
  // Transports whose CollectOnDevice does not wait for the peer's answer
  // (nccl): once the caller's streams are done with the results collected so
  // far, OK if the peer ran every one of them, else why not (those results
  // are not to be used). Others: OK.
  virtual absl::Status CheckOnDevice() { return absl::OkStatus(); }
};

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
