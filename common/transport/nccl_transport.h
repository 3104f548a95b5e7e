// The nccl transport: DataPlane messages between processes on different GPUs
// over NCCL (expert dispatch between attention workers and expert workers).
//
// A channel is one 2-rank NCCL communicator plus one NcclDataPlane.Channel
// gRPC stream: the client makes the unique id and sends it as the stream's
// first frame, both join; then each call is the DataPlaneCall's size on the
// stream and its bytes over NCCL, and the DataPlaneReply's size and bytes
// back (common/backend/byte_pipe.h; the NCCL side lives in the CUDA plugin,
// so nothing here links CUDA). No side waits on its GPU for bytes the other
// has not announced, so idle channels hold no kernel, and a client that goes
// away ends its stream, which ends the server's side. Calls on one channel
// run one at a time.
//
// Expert dispatches from an attention worker on a GPU stay on the GPUs
// (DataChannel::Post, Collect): the stream carries the dispatch's shape and
// the server's status answer; the hidden states, ids and weights go from the
// attention worker's buffers to the expert worker's GPU, and the sums back,
// as one NCCL group per side enqueued after the caller's ready event — no
// host copy, and no host waits for the other side: the server answers once
// its work is enqueued and the client reads the answers when its step is
// done (CheckCollected). A server that goes away mid-dispatch ends the
// stream; the client then aborts the communicator (freeing its stream) and
// CheckCollected reports UNAVAILABLE.
//
// Limits, stated: NCCL cannot join two ranks on one GPU, so the KV handoff
// (prefill and decode workers often share a GPU) stays on gRPC when
// --transport is nccl; host-side messages (DataChannel::Dispatch, PushKv)
// are staged through host memory at both ends; a peer that dies is noticed
// when its stream breaks or at the call deadline (NVLink gives no signal);
// a dispatch goes whole to each expert worker, which runs the pairs of the
// experts it serves (the tokens are not split by worker).
#ifndef MOESH_COMMON_TRANSPORT_NCCL_TRANSPORT_H_
#define MOESH_COMMON_TRANSPORT_NCCL_TRANSPORT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/backend/byte_pipe.h"
#include "common/transport/grpc_listener.h"
#include "common/transport/transport.h"
#include "moesh/v1/worker.grpc.pb.h"

namespace moesh {

struct NcclTransportOptions {
  int device = 0;  // this process's CUDA device
  absl::Duration connect_timeout = absl::Seconds(60);
  absl::Duration call_timeout = absl::Seconds(60);  // one call's send + reply
};

// Clients. Connect(address) takes the server's NcclDataPlane address.
std::unique_ptr<Transport> MakeNcclTransport(const NcclTransportOptions& options);

// The server: NcclDataPlane on its own gRPC port; every channel is served
// on its stream's handler thread until the client ends the stream or the
// server stops. Handlers may be null (UNIMPLEMENTED) and must outlive the
// server.
class NcclDataPlaneServer final : public DataPlaneServer, public v1::NcclDataPlane::Service {
 public:
  // Device dispatches reach `dispatch` in `device`'s memory.
  static absl::StatusOr<std::unique_ptr<NcclDataPlaneServer>> Start(const std::string& listen,
                                                                    int device,
                                                                    DispatchHandler* dispatch,
                                                                    KvHandler* kv);
  ~NcclDataPlaneServer() override;  // aborts every channel, then stops the gRPC server

  int port() const override { return listener_.port(); }
  grpc::Status Channel(grpc::ServerContext* ctx,
                       grpc::ServerReaderWriter<v1::NcclFrame, v1::NcclFrame>* stream) override;

 private:
  struct DeviceSide;
  NcclDataPlaneServer(int device, DispatchHandler* dispatch, KvHandler* kv)
      : device_(device), dispatch_(dispatch), kv_(kv) {}
  std::string Handle(const std::string& call);
  // One device-resident dispatch: its transfers (always, even when refused),
  // the experts, the answer. False if the channel cannot go on.
  bool ServeOnDevice(const v1::NcclDeviceDispatch& dispatch, BytePipe* pipe, DeviceSide* side,
                     grpc::ServerReaderWriter<v1::NcclFrame, v1::NcclFrame>* stream);

  const int device_;
  DispatchHandler* const dispatch_;
  KvHandler* const kv_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<BytePipe*> pipes_ ABSL_GUARDED_BY(mu_);  // live channels, for Abort on stop
  int next_lane_ ABSL_GUARDED_BY(mu_) = 0;             // MoeDispatch::lane of each channel
  GrpcListener listener_;                              // last: stops first
};

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_NCCL_TRANSPORT_H_
