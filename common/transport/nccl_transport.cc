#include "common/transport/nccl_transport.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <iostream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/backend/cuda_backends_plugin.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"
#include "common/transport/dispatch_wire.h"
#include "common/transport/kv_wire.h"
#include "common/transport/posted_dispatch.h"
#include "common/transport/transport_registry.h"

namespace moesh {
namespace {

using Stream = grpc::ClientReaderWriter<v1::NcclFrame, v1::NcclFrame>;

// Device dispatch limits: a frame outside them is a broken peer, not a batch.
constexpr int kMaxDeviceTokens = 1 << 20, kMaxHidden = 1 << 16, kMaxTopK = 256,
              kMaxExperts = 1 << 16;

bool DeviceShapeOk(int tokens, int hidden, int top_k) {
  return tokens >= 0 && tokens <= kMaxDeviceTokens && hidden > 0 && hidden <= kMaxHidden &&
         top_k > 0 && top_k <= kMaxTopK;
}

// A device dispatch's three inputs, in the order both sides list them.
std::vector<BytePipe::DeviceBuffer> InputBuffers(const void* hidden_states, const void* ids,
                                                 const void* weights, size_t tokens, int hidden,
                                                 int top_k) {
  return {{const_cast<void*>(hidden_states), tokens * hidden * 2},
          {const_cast<void*>(ids), tokens * top_k * sizeof(int32_t)},
          {const_cast<void*>(weights), tokens * top_k * sizeof(float)}};
}

absl::StatusOr<std::unique_ptr<DeviceMemory>> OpenDeviceMemory(int device) {
  ASSIGN_OR_RETURN(const CudaBackendsTable* cuda, CudaBackends());
  return cuda->open_device_memory(device);
}

class NcclChannel : public DataChannel {
 public:
  NcclChannel(std::string peer, int device, std::unique_ptr<v1::NcclDataPlane::Stub> stub,
              std::unique_ptr<grpc::ClientContext> ctx, std::unique_ptr<Stream> stream,
              std::unique_ptr<BytePipe> pipe, absl::Duration call_timeout)
      : peer_(std::move(peer)),
        device_(device),
        stub_(std::move(stub)),
        ctx_(std::move(ctx)),
        stream_(std::move(stream)),
        pipe_(std::move(pipe)),
        call_timeout_(call_timeout) {
    // Every answer comes through here; a stream that ends (the server went
    // away) aborts the communicator, so no transfer waits for it forever.
    reader_ = std::thread([this] {
      v1::NcclFrame frame;
      while (stream_->Read(&frame)) {
        absl::MutexLock lock(&frames_mu_);
        frames_.push_back(std::move(frame));
      }
      pipe_->Abort();
      absl::MutexLock lock(&frames_mu_);
      ended_ = true;
    });
  }
  ~NcclChannel() override {
    absl::MutexLock lock(&mu_);
    pipe_->Abort();
    stream_->WritesDone();  // ends the server's side
    ctx_->TryCancel();
    reader_.join();
    stream_->Finish().IgnoreError();
  }

  absl::Status Dispatch(const MoeDispatch& dispatch, float* out) override {
    RETURN_IF_ERROR(CheckHostDispatch(dispatch, peer_));
    v1::DataPlaneCall call;
    EncodeDispatchRequest(dispatch, call.mutable_dispatch());
    ASSIGN_OR_RETURN(const v1::DataPlaneReply reply, Call(call));
    return DecodeDispatchResponse(reply.dispatch(), dispatch, peer_, out);
  }
  absl::Status PushKv(const KvTransfer& transfer) override {
    v1::DataPlaneCall call;
    EncodePushKv(transfer, call.mutable_push_kv());
    return Call(call).status();
  }
  const std::string& peer() const override { return peer_; }
  MemoryKinds memory_kinds() const override { return {device_}; }

  absl::Status Post(const MoeDispatch& d) override {
    RETURN_IF_ERROR(CheckPostable(d, device_, peer_));
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(posted_.CheckNoneInFlight());
    if (!broken_.ok()) return broken_;
    if (!DeviceShapeOk(d.num_tokens, d.hidden, d.top_k)) {
      return absl::InvalidArgumentError(absl::StrCat("nccl device dispatch of ", d.num_tokens,
                                                     " x ", d.hidden, " top-", d.top_k));
    }
    if (d.serve != nullptr && (d.num_experts < 1 || d.num_experts > kMaxExperts)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a serve mask of ", d.num_experts, " experts"));
    }
    RETURN_IF_ERROR(Fit(d.num_tokens, d.hidden));
    v1::NcclFrame frame;
    v1::NcclDeviceDispatch* m = frame.mutable_dispatch();
    m->set_layer(d.layer), m->set_num_tokens(d.num_tokens), m->set_hidden(d.hidden),
        m->set_top_k(d.top_k);
    if (d.serve != nullptr) m->set_serve(reinterpret_cast<const char*>(d.serve), d.num_experts);
    if (!stream_->Write(frame)) return Break(absl::UnavailableError("the stream broke"));
    ++unanswered_;
    const size_t t = d.num_tokens;
    const std::vector<BytePipe::DeviceBuffer> sends =
        InputBuffers(d.hidden_bf16(), d.topk_ids, d.topk_weights, t, d.hidden, d.top_k);
    const BytePipe::DeviceBuffer recv[] = {{sums_->data(), t * d.hidden * sizeof(float)}};
    // After the inputs are complete, and after the last sums were taken out
    // of the staging buffer on the caller's stream.
    void* const after[] = {d.ready, collected_on_ != nullptr ? consumed_->get() : nullptr};
    RETURN_IF_ERROR(
        Break(pipe_->Exchange(sends, recv, after, arrived_->get(), absl::Now() + call_timeout_)));
    posted_ = {d.num_tokens, d.hidden, d.stream};
    return absl::OkStatus();
  }

  absl::Status Collect(float* out, bool accumulate) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(const PostedDispatch posted, posted_.Take());
    if (!broken_.ok()) return broken_;
    const float* sums = static_cast<const float*>(sums_->data());
    const int t = posted.tokens;
    if (posted.stream == nullptr) {  // done on return: the sums, and the server's answers
      RETURN_IF_ERROR(Break(pipe_->Drain(absl::Now() + call_timeout_)));
      RETURN_IF_ERROR(Answers());
      if (t == 0) return absl::OkStatus();
      return DeliverSums(*memory_, out, sums, t, posted.hidden, accumulate);
    }
    RETURN_IF_ERROR(memory_->Wait(posted.stream, *arrived_));
    if (t > 0)
      RETURN_IF_ERROR(
          DeliverSums(*memory_, out, sums, t, posted.hidden, accumulate, posted.stream));
    RETURN_IF_ERROR(memory_->Record(*consumed_, posted.stream));
    collected_on_ = posted.stream;
    return absl::OkStatus();
  }

  absl::Status CheckCollected() override {
    absl::MutexLock lock(&mu_);
    return Answers();
  }

 private:
  // The server's answers to the device dispatches posted so far: OK, the
  // first refusal since the last call, or UNAVAILABLE if the channel broke
  // (transfers in flight were then cut short).
  absl::Status Answers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    RETURN_IF_ERROR(ReadAnswers());
    return std::exchange(refused_, absl::OkStatus());
  }
  // Reads the answers not read yet, keeping the first refusal in refused_.
  // A stream that ended broke the channel even with every answer read: the
  // communicator was aborted, maybe under a transfer the answers promised.
  absl::Status ReadAnswers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (unanswered_ > 0) {
      ASSIGN_OR_RETURN(v1::NcclFrame frame, NextFrame(absl::Now() + call_timeout_));
      --unanswered_;
      if (frame.code() != 0 && refused_.ok()) {
        refused_ = absl::Status(static_cast<absl::StatusCode>(frame.code()), frame.message());
      }
    }
    bool ended;
    {
      absl::MutexLock lock(&frames_mu_);
      ended = ended_;
    }
    if (ended) return Break(absl::UnavailableError("the stream broke"));
    return broken_;
  }
  // The server's next frame; UNAVAILABLE (the channel broken) if the stream
  // ended or nothing came by `deadline`.
  absl::StatusOr<v1::NcclFrame> NextFrame(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    bool ended = false;
    {
      absl::MutexLock lock(&frames_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(frames_mu_) {
        return !frames_.empty() || ended_;
      };
      frames_mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
      if (!frames_.empty()) {
        v1::NcclFrame frame = std::move(frames_.front());
        frames_.pop_front();
        return frame;
      }
      ended = ended_;
    }
    return Break(absl::UnavailableError(ended ? "the stream broke" : "no answer in time"));
  }
  // Marks the channel broken for good on a transport error.
  absl::Status Break(absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (s.ok() || s.code() == absl::StatusCode::kInvalidArgument) return s;
    if (broken_.ok()) {
      broken_ = absl::UnavailableError(absl::StrCat("nccl peer ", peer_, ": ", s.message()));
      pipe_->Abort();
      ctx_->TryCancel();
    }
    return broken_;
  }
  // The staging buffer for `tokens` rows of sums, and the events.
  absl::Status Fit(int tokens, int hidden) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (memory_ == nullptr) {
      ASSIGN_OR_RETURN(memory_, OpenDeviceMemory(device_));
      ASSIGN_OR_RETURN(arrived_, memory_->MakeEvent());
      ASSIGN_OR_RETURN(consumed_, memory_->MakeEvent());
    }
    const size_t bytes = static_cast<size_t>(std::max(tokens, 256)) * hidden * sizeof(float);
    if (sums_ != nullptr && sums_->size() >= bytes) return absl::OkStatus();
    // The old buffer may still be read on the caller's stream.
    if (collected_on_ != nullptr) RETURN_IF_ERROR(memory_->Synchronize(collected_on_));
    collected_on_ = nullptr;
    const size_t grown = sums_ == nullptr ? bytes : std::max(bytes, 2 * sums_->size());
    sums_.reset();
    ASSIGN_OR_RETURN(sums_, memory_->Export(grown));
    return absl::OkStatus();
  }

  absl::StatusOr<v1::DataPlaneReply> Call(const v1::DataPlaneCall& call) {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(ReadAnswers());  // they come first on the stream
    const absl::Time deadline = absl::Now() + call_timeout_;
    const std::string bytes = call.SerializeAsString();
    v1::NcclFrame frame;
    frame.set_bytes(bytes.size());
    if (!stream_->Write(frame)) return Break(absl::UnavailableError("the stream broke"));
    RETURN_IF_ERROR(Break(pipe_->Send(bytes, deadline)));
    ASSIGN_OR_RETURN(frame, NextFrame(deadline));
    absl::StatusOr<std::string> reply_bytes = pipe_->Recv(frame.bytes(), deadline);
    RETURN_IF_ERROR(Break(reply_bytes.status()));
    v1::DataPlaneReply reply;
    if (!reply.ParseFromString(*reply_bytes))
      return Break(absl::DataLossError("an unreadable reply"));
    if (reply.code() != 0)
      return absl::Status(static_cast<absl::StatusCode>(reply.code()), reply.message());
    return reply;
  }

  const std::string peer_;
  const int device_;  // this process's CUDA device (the caller's buffers)
  absl::Mutex mu_;    // one call or device dispatch step at a time
  const std::unique_ptr<v1::NcclDataPlane::Stub> stub_;
  const std::unique_ptr<grpc::ClientContext> ctx_;
  const std::unique_ptr<Stream> stream_;
  const std::unique_ptr<BytePipe> pipe_;
  const absl::Duration call_timeout_;
  absl::Status broken_ ABSL_GUARDED_BY(mu_);
  std::thread reader_;
  absl::Mutex frames_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::deque<v1::NcclFrame> frames_ ABSL_GUARDED_BY(frames_mu_);
  bool ended_ ABSL_GUARDED_BY(frames_mu_) = false;

  // Device dispatches.
  std::unique_ptr<DeviceMemory> memory_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<DeviceRegion> sums_ ABSL_GUARDED_BY(mu_);  // fp32 rows received from the server
  std::unique_ptr<DeviceEvent> arrived_
      ABSL_GUARDED_BY(mu_);  // recorded after a dispatch's transfers
  std::unique_ptr<DeviceEvent> consumed_
      ABSL_GUARDED_BY(mu_);                            // recorded after the sums were taken out
  void* collected_on_ ABSL_GUARDED_BY(mu_) = nullptr;  // the stream consumed_ is recorded on
  PostedDispatch posted_ ABSL_GUARDED_BY(mu_);
  int unanswered_ ABSL_GUARDED_BY(mu_) = 0;    // device dispatches whose answer is not read yet
  absl::Status refused_ ABSL_GUARDED_BY(mu_);  // the first refusal among the answers read
};

class NcclTransport : public Transport {
 public:
  explicit NcclTransport(const NcclTransportOptions& options) : options_(options) {}
  absl::string_view name() const override { return "nccl"; }

  absl::StatusOr<std::unique_ptr<DataChannel>> Connect(const std::string& address) override {
    ASSIGN_OR_RETURN(const CudaBackendsTable* cuda, CudaBackends());
    ASSIGN_OR_RETURN(std::string id, cuda->new_nccl_id());
    auto stub = v1::NcclDataPlane::NewStub(CreateInternalChannel(address));
    auto ctx = std::make_unique<grpc::ClientContext>();
    std::unique_ptr<Stream> stream = stub->Channel(ctx.get());
    v1::NcclFrame hello;
    hello.set_unique_id(id);
    hello.set_client(absl::StrCat("pid ", getpid(), " cuda:", options_.device));
    if (!stream->Write(hello)) {
      const grpc::Status g = stream->Finish();
      return absl::Status(
          g.ok() ? absl::StatusCode::kUnavailable : static_cast<absl::StatusCode>(g.error_code()),
          absl::StrCat("nccl peer ", address, ": ", g.error_message()));
    }
    // The server acknowledges the id (or ends the stream saying why not),
    // then joins as rank 1 while we join as rank 0.
    v1::NcclFrame ack;
    if (!stream->Read(&ack)) {
      const grpc::Status g = stream->Finish();
      return absl::Status(
          g.ok() ? absl::StatusCode::kUnavailable : static_cast<absl::StatusCode>(g.error_code()),
          absl::StrCat("nccl peer ", address, ": ", g.error_message()));
    }
    absl::StatusOr<std::unique_ptr<BytePipe>> pipe = cuda->open_nccl_pipe(
        id, /*rank=*/0, options_.device, absl::Now() + options_.connect_timeout);
    if (!pipe.ok()) {
      ctx->TryCancel();
      stream->Finish().IgnoreError();
      return absl::UnavailableError(absl::StrCat("nccl peer ", address, " (cuda:", ack.device(),
                                                 "): ", pipe.status().message()));
    }
    return std::unique_ptr<DataChannel>(new NcclChannel(address, options_.device, std::move(stub),
                                                        std::move(ctx), std::move(stream),
                                                        std::move(*pipe), options_.call_timeout));
  }

 private:
  const NcclTransportOptions options_;
};

}  // namespace

std::unique_ptr<Transport> MakeNcclTransport(const NcclTransportOptions& options) {
  return std::make_unique<NcclTransport>(options);
}

absl::StatusOr<std::unique_ptr<NcclDataPlaneServer>> NcclDataPlaneServer::Start(
    const std::string& listen, int device, DispatchHandler* dispatch, KvHandler* kv) {
  RETURN_IF_ERROR(CudaBackends().status());  // no plugin: say so now, not at the first channel
  std::unique_ptr<NcclDataPlaneServer> s(new NcclDataPlaneServer(device, dispatch, kv));
  RETURN_IF_ERROR(s->listener_.Start(listen, {s.get()}));
  return s;
}

NcclDataPlaneServer::~NcclDataPlaneServer() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  for (BytePipe* p : pipes_) p->Abort();
}  // then listener_ stops the gRPC server (cancelling the streams; their handlers return)

// A channel's device-resident side: the dispatch's inputs and the sums, on
// this server's GPU, grown as larger dispatches come; the events ordering
// the experts between the receive and the send.
struct NcclDataPlaneServer::DeviceSide {
  std::unique_ptr<DeviceMemory> memory;
  std::unique_ptr<DeviceRegion> input, output;
  std::unique_ptr<DeviceEvent> received, computed;
  int capacity = 0, hidden = 0, top_k = 0;
  size_t ids = 0, weights = 0;  // offsets in `input`
  int lane = 0;                 // its dispatches' MoeDispatch::lane
};

grpc::Status NcclDataPlaneServer::Channel(
    grpc::ServerContext* ctx, grpc::ServerReaderWriter<v1::NcclFrame, v1::NcclFrame>* stream) {
  v1::NcclFrame frame;
  if (!stream->Read(&frame)) return grpc::Status::OK;
  if (frame.unique_id().empty())
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no NCCL unique id");
  absl::StatusOr<const CudaBackendsTable*> cuda = CudaBackends();
  if (!cuda.ok())
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        std::string(cuda.status().message()));
  v1::NcclFrame ack;
  ack.set_device(device_);
  if (!stream->Write(ack)) return grpc::Status::OK;
  absl::StatusOr<std::unique_ptr<BytePipe>> pipe = (*cuda)->open_nccl_pipe(
      frame.unique_id(), /*rank=*/1, device_, absl::Now() + absl::Seconds(60));
  if (!pipe.ok()) {
    std::cerr << "nccl data plane: channel from " << frame.client()
              << " not opened: " << pipe.status() << std::endl;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, std::string(pipe.status().message()));
  }
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "shutting down");
    pipes_.push_back(pipe->get());
  }
  DeviceSide side;
  {
    absl::MutexLock lock(&mu_);
    side.lane = next_lane_++;
  }
  const std::string client = frame.client();
  bool ok = true;
  while (ok && stream->Read(&frame)) {  // until the client ends the stream
    if (frame.has_dispatch()) {
      if (side.memory == nullptr) {
        std::cerr << "nccl data plane: " << client
                  << " dispatches device-resident (GPU to GPU, cuda:" << device_ << " here)"
                  << std::endl;
      }
      ok = ServeOnDevice(frame.dispatch(), pipe->get(), &side, stream);
      continue;
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    absl::StatusOr<std::string> call = (*pipe)->Recv(frame.bytes(), deadline);
    if (!call.ok()) break;
    const std::string reply = Handle(*call);
    v1::NcclFrame out;
    out.set_bytes(reply.size());
    ok = stream->Write(out) && (*pipe)->Send(reply, deadline).ok();
  }
  {
    absl::MutexLock lock(&mu_);
    pipes_.erase(std::find(pipes_.begin(), pipes_.end(), pipe->get()));
  }
  pipe->reset();  // aborts the communicator and waits for its stream, before `side`'s buffers go
  return grpc::Status::OK;
}

bool NcclDataPlaneServer::ServeOnDevice(
    const v1::NcclDeviceDispatch& m, BytePipe* pipe, DeviceSide* side,
    grpc::ServerReaderWriter<v1::NcclFrame, v1::NcclFrame>* stream) {
  const int t = m.num_tokens();
  if (!DeviceShapeOk(t, m.hidden(), m.top_k()) ||
      m.serve().size() > static_cast<size_t>(kMaxExperts)) {
    std::cerr << "nccl data plane: a device dispatch of " << t << " x " << m.hidden() << " top-"
              << m.top_k() << ": not a shape this channel can carry; closing it" << std::endl;
    return false;
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  // Buffers (and events) for this shape: the transfer must happen whatever
  // the experts say, so failing here ends the channel.
  if (side->memory == nullptr || t > side->capacity || m.hidden() != side->hidden ||
      m.top_k() != side->top_k) {
    absl::Status s;
    if (side->memory == nullptr) {
      absl::StatusOr<std::unique_ptr<DeviceMemory>> mem = OpenDeviceMemory(device_);
      s = mem.status();
      if (s.ok()) side->memory = std::move(*mem);
      absl::StatusOr<std::unique_ptr<DeviceEvent>> r = s.ok() ? side->memory->MakeEvent() : s;
      absl::StatusOr<std::unique_ptr<DeviceEvent>> c =
          r.ok() ? side->memory->MakeEvent() : r.status();
      s = c.status();
      if (s.ok()) side->received = std::move(*r), side->computed = std::move(*c);
    }
    if (s.ok()) s = pipe->Drain(deadline);  // the old buffers are free
    if (s.ok()) {
      int capacity = 256;
      while (capacity < t) capacity *= 2;
      auto align = [](size_t n) { return (n + 255) / 256 * 256; };
      side->input.reset(), side->output.reset();
      side->ids = align(static_cast<size_t>(capacity) * m.hidden() * 2);
      side->weights =
          side->ids + align(static_cast<size_t>(capacity) * m.top_k() * sizeof(int32_t));
      absl::StatusOr<std::unique_ptr<DeviceRegion>> in = side->memory->Export(
          side->weights + static_cast<size_t>(capacity) * m.top_k() * sizeof(float));
      absl::StatusOr<std::unique_ptr<DeviceRegion>> out =
          in.ok() ? side->memory->Export(static_cast<size_t>(capacity) * m.hidden() * sizeof(float))
                  : in.status();
      s = out.status();
      if (s.ok()) {
        side->input = std::move(*in), side->output = std::move(*out);
        side->capacity = capacity, side->hidden = m.hidden(), side->top_k = m.top_k();
      }
    }
    if (!s.ok()) {
      side->capacity = 0;
      std::cerr << "nccl data plane: no device buffers for a dispatch of " << t << " tokens: " << s
                << "; closing the channel" << std::endl;
      return false;
    }
  }
  char* input = static_cast<char*>(side->input->data());
  float* output = static_cast<float*>(side->output->data());
  const std::vector<BytePipe::DeviceBuffer> recvs =
      InputBuffers(input, input + side->ids, input + side->weights, t, m.hidden(), m.top_k());
  if (!pipe->Exchange({}, recvs, {}, side->received->get(), deadline).ok()) return false;
  absl::Status s;
  if (dispatch_ == nullptr) {
    s = absl::UnimplementedError("this worker takes no expert dispatch");
  } else {
    MoeDispatch d;
    d.layer = m.layer(), d.num_tokens = t, d.hidden = m.hidden(), d.top_k = m.top_k();
    d.memory = DispatchMemory::CudaDevice(device_);
    d.hidden_states = input;
    d.topk_ids = reinterpret_cast<const int32_t*>(input + side->ids);
    d.topk_weights = reinterpret_cast<const float*>(input + side->weights);
    d.serve = m.serve().empty() ? nullptr : reinterpret_cast<const uint8_t*>(m.serve().data());
    d.num_experts = static_cast<int>(m.serve().size());
    d.ready = side->received->get(), d.done = side->computed->get();
    d.lane = side->lane;
    s = dispatch_->Dispatch(d, output);
  }
  // The sums go back in any case (the client's receive is posted); after
  // the experts where they ran.
  const BytePipe::DeviceBuffer send[] = {
      {output, static_cast<size_t>(t) * m.hidden() * sizeof(float)}};
  void* const after[] = {s.ok() ? side->computed->get() : nullptr};
  if (!pipe->Exchange(send, {}, after, nullptr, deadline).ok()) return false;
  if (!s.ok()) {
    // Nothing may still be writing the sums when the next dispatch comes.
    if (!pipe->Drain(deadline).ok()) return false;
  }
  v1::NcclFrame answer;
  answer.set_code(static_cast<int>(s.code()));
  answer.set_message(std::string(s.message()));
  return stream->Write(answer);
}

std::string NcclDataPlaneServer::Handle(const std::string& bytes) {
  v1::DataPlaneCall call;
  v1::DataPlaneReply reply;
  absl::Status s;
  if (!call.ParseFromString(bytes)) {
    s = absl::InvalidArgumentError("an unreadable DataPlaneCall");
  } else if (call.has_dispatch()) {
    s = dispatch_ != nullptr ? ServeDispatch(*dispatch_, call.dispatch(), reply.mutable_dispatch())
                             : absl::UnimplementedError("this worker takes no expert dispatch");
  } else if (call.has_push_kv()) {
    s = kv_ != nullptr ? ServePushKv(*kv_, call.push_kv())
                       : absl::UnimplementedError("this worker takes no KV");
  } else {
    s = absl::InvalidArgumentError("an empty DataPlaneCall");
  }
  if (!s.ok()) {
    reply.Clear();
    reply.set_code(static_cast<int>(s.code()));
    reply.set_message(std::string(s.message()));
  }
  return reply.SerializeAsString();
}

// NCCL between GPUs: expert dispatch device to device; a worker without
// dispatch handlers (decode: KV only) stays on gRPC.
const TransportPlugin& NcclTransportPlugin() {
  static const BasicTransportPlugin plugin =
      DeviceTransportPlugin("nccl", MakeNcclTransport, [](const DataPlaneServeOptions& o) {
        return NcclDataPlaneServer::Start(o.host + ":0", o.cuda_device, o.dispatch, o.kv);
      });
  return plugin;
}

}  // namespace moesh
