// The transports as plugins: one object per transport name with both sides —
// Connect (the sending side: channels to peers) and Serve (the receiving side
// a worker starts beside its gRPC server) — and the capabilities callers
// decide by, so no caller compares transport names. Built in: grpc, inproc,
// ucx, nccl, cuda_ipc (their GPU halves come from the CUDA plugin at run time).
#ifndef MOESH_COMMON_TRANSPORT_TRANSPORT_REGISTRY_H_
#define MOESH_COMMON_TRANSPORT_TRANSPORT_REGISTRY_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/transport/transport.h"

namespace moesh {

struct TransportCapabilities {
  // Moves expert dispatches from and into CUDA device memory (its channels'
  // memory_kinds() name the device; DataChannel::Post): a GPU attention
  // worker's MoE layers skip the host. Such a transport needs the CUDA plugin
  // and a GPU on both sides.
  bool device_dispatch = false;
  // Carries the KV handoff itself; false: the KV goes over gRPC beside it
  // (NCCL cannot join two ranks of one GPU, and prefill and decode may share one).
  bool carries_kv = true;
  // A prefill worker on a GPU may hand its KV over device to device (the
  // decode worker copies from its memory: same node).
  bool device_kv = false;
};

// What a worker's receiving side serves. Handlers may be null (their calls
// answer UNIMPLEMENTED) and must outlive the server. `dispatch` gets host
// dispatches and, from device transports, device ones.
struct DataPlaneServeOptions {
  std::string host;          // the advertised host
  std::string grpc_address;  // the worker's gRPC address (grpc rides on it)
  DispatchHandler* dispatch = nullptr;
  KvHandler* kv = nullptr;
  int cuda_device = 0;  // where device-resident dispatches land
};

// A running receiving side (null where it rides on the worker's gRPC server).
struct DataPlaneEndpoint {
  std::unique_ptr<DataPlaneServer> server;
  std::string address;  // host:port peers send to
};

class TransportPlugin {
 public:
  virtual ~TransportPlugin() = default;
  virtual absl::string_view name() const = 0;
  virtual TransportCapabilities capabilities() const = 0;
  // The sending side; device transports move memory of CUDA device `cuda_device`.
  virtual absl::StatusOr<std::unique_ptr<Transport>> Connect(int cuda_device) const = 0;
  // The receiving side. INVALID_ARGUMENT where the transport has none
  // (inproc: handlers are bound in-process, BindInproc).
  virtual absl::StatusOr<DataPlaneEndpoint> Serve(const DataPlaneServeOptions& options) const = 0;
};

// A plugin from its parts: each transport's .cc makes its own from these.
class BasicTransportPlugin final : public TransportPlugin {
 public:
  using ConnectFn = std::function<absl::StatusOr<std::unique_ptr<Transport>>(int cuda_device)>;
  using ServeFn =
      std::function<absl::StatusOr<DataPlaneEndpoint>(const DataPlaneServeOptions& options)>;
  BasicTransportPlugin(absl::string_view name, TransportCapabilities capabilities,
                       ConnectFn connect, ServeFn serve)
      : name_(name),
        capabilities_(capabilities),
        connect_(std::move(connect)),
        serve_(std::move(serve)) {}
  absl::string_view name() const override { return name_; }
  TransportCapabilities capabilities() const override { return capabilities_; }
  absl::StatusOr<std::unique_ptr<Transport>> Connect(int cuda_device) const override {
    return connect_(cuda_device);
  }
  absl::StatusOr<DataPlaneEndpoint> Serve(const DataPlaneServeOptions& options) const override {
    return serve_(options);
  }

 private:
  const absl::string_view name_;
  const TransportCapabilities capabilities_;
  const ConnectFn connect_;
  const ServeFn serve_;
};

// The device transports' capabilities (nccl, cuda_ipc): expert dispatch in
// device memory, the KV beside them on gRPC or device to device.
constexpr TransportCapabilities kDeviceTransportCapabilities = {
    /*device_dispatch=*/true, /*carries_kv=*/false, /*device_kv=*/true};

// The endpoint of a listener of the transport's own, at `host`.
DataPlaneEndpoint ListenerEndpoint(const std::string& host,
                                   std::unique_ptr<DataPlaneServer> server);
// The endpoint riding on the worker's gRPC server.
DataPlaneEndpoint GrpcEndpoint(const DataPlaneServeOptions& options);
// A device transport's endpoint: the listener `start()` returns
// (StatusOr<unique_ptr<a DataPlaneServer>>), or — for a worker with no
// dispatch handler to serve (decode: KV only, which stays on gRPC) — none.
template <typename StartFn>
absl::StatusOr<DataPlaneEndpoint> ServeDispatchListener(const DataPlaneServeOptions& options,
                                                        StartFn start) {
  if (options.dispatch == nullptr) {
    return GrpcEndpoint(options);
  }
  auto server = start();
  if (!server.ok()) return server.status();
  return ListenerEndpoint(options.host, std::move(*server));
}

// A device transport's plugin (nccl, cuda_ipc): its transport from `make`
// with options on the CUDA device (an Options with a `device`), and the
// listener `listen(options)` starts (a StatusOr<unique_ptr<a DataPlaneServer>>)
// where ServeDispatchListener serves one.
template <typename Options, typename ListenFn>
BasicTransportPlugin DeviceTransportPlugin(absl::string_view name,
                                           std::unique_ptr<Transport> (*make)(const Options&),
                                           ListenFn listen) {
  return BasicTransportPlugin(
      name, kDeviceTransportCapabilities,
      [make](int cuda_device) -> absl::StatusOr<std::unique_ptr<Transport>> {
        Options o;
        o.device = cuda_device;
        return make(o);
      },
      [listen](const DataPlaneServeOptions& o) {
        return ServeDispatchListener(o, [&] { return listen(o); });
      });
}

// The plugin of that name; INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<const TransportPlugin*> FindTransport(absl::string_view name);
// Every transport's name, in the registry's order.
std::vector<std::string> TransportNames();

// The built-in plugins (each defined beside its transport).
const TransportPlugin& GrpcTransportPlugin();
const TransportPlugin& InprocTransportPlugin();
const TransportPlugin& UcxTransportPlugin();
const TransportPlugin& NcclTransportPlugin();
const TransportPlugin& CudaIpcTransportPlugin();

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_TRANSPORT_REGISTRY_H_
