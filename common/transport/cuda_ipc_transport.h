// The cuda_ipc transport: attention workers and expert workers on one node
// (sharing a GPU, or on GPUs with peer access) exchange expert dispatches in
// device memory; no payload byte goes through the host.
//
// A channel is an IpcDataPlane.Attach gRPC stream, a shared-memory doorbell
// (shm_doorbell.h) and two device regions the client exports (CUDA IPC
// handles; device_memory.h): the input (bf16 hidden states, top-k ids and
// weights) and the output (fp32 partial sums). Per MoE layer the client
// copies the dispatch into the input region (device to device), rings the
// doorbell with (layer, tokens, the experts to serve); the server's thread
// for the channel runs the experts from the input region into the output
// region (DispatchHandler, a device dispatch) and rings back; the client copies or adds
// the output into its buffer. The regions grow when a larger dispatch comes
// (the server maps the new ones). On one GPU across processes dispatches are
// pipelined on the device through two words at the input region's tail: the
// client enqueues the copies on its stream and the write of a new value into
// `ready` before ringing; the server makes its stream wait for that value,
// enqueues the experts and the write of the same value into `done`, and rings
// back at once; the client makes its stream wait for `done` before using the
// output. Neither host waits for the device (the sums are ordered, not
// complete, when Collect returns).
//
// The KV handoff can use device memory too (kv_handoff.h, KvHandoff::kDevice):
// the decode worker copies the prefill worker's KV blocks from its
// IPC-exported pool. The stream carries nothing after the
// handshake: it ends when either side goes away, which fails the other's
// waits at once.
//
// Host-side calls (DataChannel::Dispatch, PushKv) go over gRPC to the same
// port (the DataPlane service), so the KV handoff and CPU attention workers
// work unchanged; the attention side's CudaModel takes the device path
// (ExpertClient::memory_kinds). Limits, stated: the client and server
// must be processes on one node (a client in the server's own process is
// served through its pointers); dispatches from several attention workers
// are not merged into one grouped GEMM (they take turns on the GPU).
#ifndef MOESH_COMMON_TRANSPORT_CUDA_IPC_TRANSPORT_H_
#define MOESH_COMMON_TRANSPORT_CUDA_IPC_TRANSPORT_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/backend/device_memory.h"
#include "common/transport/grpc_data_plane_service.h"
#include "common/transport/grpc_listener.h"
#include "common/transport/transport.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

struct CudaIpcTransportOptions {
  int device = 0;  // this process's CUDA device (where dispatch buffers live)
  absl::Duration connect_timeout = absl::Seconds(30);
  absl::Duration call_timeout = absl::Seconds(60);
};

// Clients. Connect(address) takes the server's IpcDataPlane address; it
// needs no GPU (host calls work anywhere); the first device dispatch loads
// the CUDA plugin.
std::unique_ptr<Transport> MakeCudaIpcTransport(const CudaIpcTransportOptions& options);

// The server: IpcDataPlane and DataPlane on their own gRPC port. Each
// attached channel is served by its own thread. Handlers may be null
// (UNIMPLEMENTED) and must outlive the server.
class CudaIpcDataPlaneServer final : public DataPlaneServer, public v1::IpcDataPlane::Service {
 public:
  // Device dispatches reach `dispatch` in `device`'s memory; host ones come
  // over the DataPlane service.
  static absl::StatusOr<std::unique_ptr<CudaIpcDataPlaneServer>> Start(const std::string& listen,
                                                                       int device,
                                                                       DispatchHandler* dispatch,
                                                                       KvHandler* kv);
  ~CudaIpcDataPlaneServer() override;  // stops every channel, then the gRPC server

  int port() const override { return listener_.port(); }
  grpc::Status Attach(grpc::ServerContext* ctx,
                      grpc::ServerReaderWriter<v1::IpcFrame, v1::IpcFrame>* stream) override;

 private:
  struct Attachment;
  CudaIpcDataPlaneServer(int device, DispatchHandler* dispatch, KvHandler* kv)
      : device_(device), dispatch_(dispatch), host_(dispatch, kv) {}
  // Serves one channel's doorbell until `a->stop`.
  void Serve(Attachment* a);
  // Unblocks and drains the lane of an attachment whose client went away (device flags).
  void ReleaseLane(const Attachment& a);
  // One doorbell request; returns the reply.
  std::string Handle(Attachment* a, const std::string& request);
  absl::StatusOr<DeviceMemory*> memory();

  const int device_;
  DispatchHandler* const dispatch_;
  GrpcDataPlaneService host_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Attachment*> attachments_ ABSL_GUARDED_BY(mu_);
  int next_lane_ ABSL_GUARDED_BY(mu_) = 0;  // MoeDispatch::lane of each attachment
  std::unique_ptr<DeviceMemory> memory_ ABSL_GUARDED_BY(mu_);  // opened at the first attach
  GrpcListener listener_;                                      // last: stops first
};

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_CUDA_IPC_TRANSPORT_H_
