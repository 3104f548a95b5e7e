#include "common/transport/cuda_ipc_transport.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "common/backend/cuda_backends_plugin.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/internal_plane.h"
#include "common/transport/posted_dispatch.h"
#include "common/transport/shm_doorbell.h"
#include "common/transport/transport_registry.h"

namespace moesh {
namespace {

constexpr int kMaxExperts = 1024;
constexpr size_t kMaxHandle = 64;

// What the doorbell carries (plain bytes: both ends are this build).
struct IpcRequest {
  enum Kind : int32_t { kAttach = 1, kDispatch = 2 };
  int32_t kind = 0;
  // kAttach: the client's regions, for dispatches of up to `capacity` tokens.
  int32_t capacity = 0, hidden = 0, top_k = 0;
  uint64_t input_bytes = 0, output_bytes = 0;
  uint64_t input_ptr = 0, output_ptr = 0;  // a client in the server's own process
  uint32_t input_handle_size = 0, output_handle_size = 0;
  char input_handle[kMaxHandle] = {};
  char output_handle[kMaxHandle] = {};
  // kAttach, same GPU, other process: the offset in the input region of two
  // device words, `ready` then `done`, that order the dispatches on the
  // device (see `pipelined`; 0: none).
  uint64_t flags_offset = 0;
  // kDispatch.
  int32_t layer = 0, num_tokens = 0, num_experts = 0;
  // Pipelined (sync_value nonzero, a new value each dispatch): the inputs
  // are complete on the device once `ready` == sync_value; the
  // server enqueues its work after that, then the write of sync_value into
  // `done`, and answers without waiting; the client's stream waits for
  // `done` == sync_value before it uses the sums. (Device words rather than
  // interprocess events: ~10 us less a hand-off under MPS; BENCHMARKS,
  // twenty-eighth session.)
  uint32_t sync_value = 0;
  uint8_t serve[kMaxExperts] = {};
};
struct IpcReply {
  int32_t code = 0;  // absl::StatusCode
  char message[1024] = {};
};
static_assert(sizeof(IpcRequest) <= ShmDoorbell::kMaxMessage &&
              sizeof(IpcReply) <= ShmDoorbell::kMaxMessage);

// The input region: bf16 hidden states, then ids, then weights, then the
// two flag words (ready, done), each 256-byte aligned.
struct InputLayout {
  size_t ids = 0, weights = 0, flags = 0, bytes = 0;
  InputLayout(int capacity, int hidden, int top_k) {
    auto align = [](size_t n) { return (n + 255) / 256 * 256; };
    ids = align(static_cast<size_t>(capacity) * hidden * 2);
    weights = ids + align(static_cast<size_t>(capacity) * top_k * 4);
    flags = weights + align(static_cast<size_t>(capacity) * top_k * 4);
    bytes = flags + 256;
  }
};

template <typename T>
std::string Bytes(const T& v) {
  return std::string(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
bool FromBytes(const std::string& s, T* v) {
  if (s.size() != sizeof(T)) return false;
  std::memcpy(v, s.data(), sizeof(T));
  return true;
}
IpcReply ReplyOf(const absl::Status& s) {
  IpcReply r;
  r.code = static_cast<int32_t>(s.code());
  const std::string m(s.message().substr(0, sizeof(r.message) - 1));
  std::memcpy(r.message, m.data(), m.size());
  return r;
}
absl::Status StatusOf(const IpcReply& r) {
  return absl::Status(static_cast<absl::StatusCode>(r.code),
                      std::string(r.message, strnlen(r.message, sizeof(r.message))));
}

absl::StatusOr<std::unique_ptr<DeviceMemory>> OpenDeviceMemory(int device) {
  ASSIGN_OR_RETURN(const CudaBackendsTable* cuda, CudaBackends());
  return cuda->open_device_memory(device);
}

using ClientStream = grpc::ClientReaderWriter<v1::IpcFrame, v1::IpcFrame>;

// This process's IpcFrame.process_token.
uint64_t ProcessToken() {
  static const uint64_t token = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  }();
  return token;
}

class IpcChannel : public DataChannel {
 public:
  IpcChannel(std::string peer, int device, bool same_process,
             const CudaIpcTransportOptions& options, std::unique_ptr<DataChannel> host,
             std::unique_ptr<v1::IpcDataPlane::Stub> stub, std::unique_ptr<grpc::ClientContext> ctx,
             std::unique_ptr<ClientStream> stream, std::unique_ptr<ShmDoorbell> doorbell)
      : peer_(std::move(peer)),
        device_(device),
        same_process_(same_process),
        options_(options),
        host_(std::move(host)),
        stub_(std::move(stub)),
        ctx_(std::move(ctx)),
        stream_(std::move(stream)),
        doorbell_(std::move(doorbell)) {
    // The stream carries nothing more; Read returns when the server goes.
    watcher_ = std::thread([this] {
      v1::IpcFrame frame;
      while (stream_->Read(&frame)) {
      }
      broken_.store(true);
      ReleaseDone();
    });
  }
  ~IpcChannel() override {
    {
      // A dispatch in flight still writes to the regions: let it finish
      // before they are freed (the server's thread checks for the end of
      // the stream only between calls).
      absl::MutexLock lock(&mu_);
      if (posted_.in_flight())
        doorbell_->WaitReply(absl::Now() + absl::Seconds(5), &broken_).IgnoreError();
    }
    ctx_->TryCancel();
    watcher_.join();
    stream_->Finish().IgnoreError();
  }

  absl::Status Dispatch(const MoeDispatch& dispatch, float* out) override {
    return host_->Dispatch(dispatch, out);  // checks for host memory
  }
  absl::Status PushKv(const KvTransfer& transfer) override { return host_->PushKv(transfer); }
  const std::string& peer() const override { return peer_; }
  MemoryKinds memory_kinds() const override { return {options_.device}; }

  absl::Status Post(const MoeDispatch& d) override {
    RETURN_IF_ERROR(CheckPostable(d, options_.device, peer_));
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(posted_.CheckNoneInFlight());
    RETURN_IF_ERROR(Usable());
    if (d.num_tokens < 0 || d.hidden <= 0 || d.top_k <= 0)
      return absl::InvalidArgumentError("bad dispatch shape");
    const bool refit =
        input_ == nullptr || d.num_tokens > capacity_ || d.hidden != hidden_ || d.top_k != top_k_;
    if (collected_on_ != nullptr && (d.ready == nullptr || refit)) {
      // The last result may still be being copied out on the caller's
      // stream, and nothing orders this dispatch (or freeing the regions for
      // larger ones) after it: wait, so it is not overwritten or freed.
      RETURN_IF_ERROR(memory_->Synchronize(collected_on_));
    }
    collected_on_ = nullptr;
    RETURN_IF_ERROR(Fit(d.num_tokens, d.hidden, d.top_k));
    const InputLayout in(capacity_, hidden_, top_k_);
    char* base = static_cast<char*>(input_->data());
    const size_t t = d.num_tokens;
    // Pipelined: the copies go on the caller's stream and the ready word
    // marks them done; nobody's host waits for the device. (Not without
    // tokens: Collect returns at once then, and a `ready` written again before
    // the server's lane waited for this one would hold the lane forever.)
    const bool pipelined = words_ != nullptr && d.stream != nullptr && d.num_tokens > 0;
    if (t > 0) {
      const DeviceMemory::CopyRange copies[] = {
          {base, d.hidden_bf16(), t * d.hidden * 2},
          {base + in.ids, d.topk_ids, t * d.top_k * sizeof(int32_t)},
          {base + in.weights, d.topk_weights, t * d.top_k * sizeof(float)}};
      if (pipelined) {
        RETURN_IF_ERROR(memory_->Copy(copies, d.stream));
      } else {
        RETURN_IF_ERROR(
            memory_->Copy(copies, nullptr, d.ready));  // waits for the inputs on the device
      }
    }
    uint32_t sync_value = 0;
    if (pipelined) {
      if (++seq_ == 0) seq_ = 1;  // 0 is the words' value before any dispatch
      sync_value = seq_;
      RETURN_IF_ERROR(memory_->WriteFlag(d.stream, words_ + kReady, sync_value));
    }
    IpcRequest r;
    r.kind = IpcRequest::kDispatch;
    r.sync_value = sync_value;
    r.layer = d.layer, r.num_tokens = d.num_tokens, r.hidden = d.hidden, r.top_k = d.top_k;
    if (d.serve != nullptr) {
      if (d.num_experts < 1 || d.num_experts > kMaxExperts) {
        return absl::InvalidArgumentError(
            absl::StrCat("a serve mask of ", d.num_experts, " experts (1..", kMaxExperts, ")"));
      }
      r.num_experts = d.num_experts;
      std::memcpy(r.serve, d.serve, d.num_experts);
    }
    RETURN_IF_ERROR(Break(doorbell_->Post(Bytes(r))));
    posted_ = {d.num_tokens, d.hidden, d.stream, sync_value};
    return absl::OkStatus();
  }

  absl::Status Collect(float* out, bool accumulate) override {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(const PostedDispatch posted, posted_.Take());
    ASSIGN_OR_RETURN(IpcReply reply, Call());
    RETURN_IF_ERROR(StatusOf(reply));
    if (posted.tokens == 0) return absl::OkStatus();
    // On the caller's stream where it gave one: the region is not written
    // again before the next Post, which waits for that stream's next event.
    const float* result = static_cast<const float*>(output_->data());
    collected_on_ = posted.stream;
    if (posted.sync_value != 0)  // pipelined: the sums are written
      RETURN_IF_ERROR(memory_->WaitFlag(posted.stream, words_ + kDone, posted.sync_value));
    return DeliverSums(*memory_, out, result, posted.tokens, posted.hidden, accumulate,
                       posted.stream);
  }

 private:
  enum FlagWord { kReady = 0, kDone = 1 };  // words_[kReady], words_[kDone]
  // The server is gone: a caller's stream may wait for a `done` it will
  // never write. Writing the last value releases it (the step that used
  // those sums fails: every later Post and Collect is UNAVAILABLE).
  void ReleaseDone() {
    absl::MutexLock lock(&mu_);
    if (words_ != nullptr && seq_ != 0)
      memory_->WriteFlag(nullptr, words_ + kDone, seq_).IgnoreError();
  }
  absl::Status Usable() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (broken_.load())
      return absl::UnavailableError(absl::StrCat("cuda_ipc peer ", peer_, " is gone"));
    if (memory_ == nullptr) {
      ASSIGN_OR_RETURN(memory_, OpenDeviceMemory(options_.device));
    }
    return absl::OkStatus();
  }
  // Marks the channel broken on transport errors.
  absl::Status Break(absl::Status s) {
    if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) {
      broken_.store(true);
      ctx_->TryCancel();
      return absl::UnavailableError(absl::StrCat("cuda_ipc peer ", peer_, ": ", s.message()));
    }
    return s;
  }
  absl::StatusOr<IpcReply> Call() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<std::string> bytes =
        doorbell_->WaitReply(absl::Now() + options_.call_timeout, &broken_);
    RETURN_IF_ERROR(Break(bytes.status()));
    IpcReply reply;
    if (!FromBytes(*bytes, &reply))
      return Break(absl::DataLossError("an unreadable doorbell reply"));
    return reply;
  }
  // Regions for `tokens` tokens of this shape, the server attached to them.
  absl::Status Fit(int tokens, int hidden, int top_k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (input_ != nullptr && tokens <= capacity_ && hidden == hidden_ && top_k == top_k_)
      return absl::OkStatus();
    int capacity = 256;
    while (capacity < tokens) capacity *= 2;
    const InputLayout in(capacity, hidden, top_k);
    // New regions first: the old ones stay mapped on the server until it
    // has switched to these.
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceRegion> input, memory_->Export(in.bytes));
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceRegion> output,
                     memory_->Export(static_cast<size_t>(capacity) * hidden * sizeof(float)));
    IpcRequest r;
    r.kind = IpcRequest::kAttach;
    r.capacity = capacity, r.hidden = hidden, r.top_k = top_k;
    r.input_bytes = input->size(), r.output_bytes = output->size();
    uint32_t* words = nullptr;
    if (!same_process_ && device_ == options_.device) {  // pipelined through two words
      words = reinterpret_cast<uint32_t*>(static_cast<char*>(input->data()) + in.flags);
      RETURN_IF_ERROR(memory_->WriteFlag(nullptr, words + kReady, 0));
      RETURN_IF_ERROR(memory_->WriteFlag(nullptr, words + kDone, 0));
      r.flags_offset = in.flags;
    }
    if (same_process_) {
      r.input_ptr = reinterpret_cast<uint64_t>(input->data());
      r.output_ptr = reinterpret_cast<uint64_t>(output->data());
    } else {
      r.input_handle_size = static_cast<uint32_t>(std::min(kMaxHandle, input->handle().size()));
      r.output_handle_size = static_cast<uint32_t>(std::min(kMaxHandle, output->handle().size()));
      std::memcpy(r.input_handle, input->handle().data(), r.input_handle_size);
      std::memcpy(r.output_handle, output->handle().data(), r.output_handle_size);
    }
    absl::Status s = Break(doorbell_->Post(Bytes(r)));
    absl::StatusOr<IpcReply> reply = s.ok() ? Call() : absl::StatusOr<IpcReply>(s);
    s = reply.ok() ? StatusOf(*reply) : reply.status();
    // Either way the server has let go of the old regions.
    input_ = s.ok() ? std::move(input) : nullptr;
    output_ = s.ok() ? std::move(output) : nullptr;
    words_ = s.ok() ? words : nullptr;
    if (s.ok()) capacity_ = capacity, hidden_ = hidden, top_k_ = top_k;
    return s;
  }

  const std::string peer_;
  const int device_;  // the server's
  const bool same_process_;
  const CudaIpcTransportOptions options_;
  const std::unique_ptr<DataChannel> host_;
  const std::unique_ptr<v1::IpcDataPlane::Stub> stub_;
  const std::unique_ptr<grpc::ClientContext> ctx_;
  const std::unique_ptr<ClientStream> stream_;
  std::atomic<bool> broken_{false};
  std::thread watcher_;

  absl::Mutex mu_;
  const std::unique_ptr<ShmDoorbell> doorbell_;  // used under mu_
  std::unique_ptr<DeviceMemory> memory_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<DeviceRegion> input_ ABSL_GUARDED_BY(mu_), output_ ABSL_GUARDED_BY(mu_);
  int capacity_ ABSL_GUARDED_BY(mu_) = 0, hidden_ ABSL_GUARDED_BY(mu_) = 0,
                top_k_ ABSL_GUARDED_BY(mu_) = 0;
  PostedDispatch posted_ ABSL_GUARDED_BY(mu_);
  void* collected_on_ ABSL_GUARDED_BY(mu_) =
      nullptr;  // the stream the last result is copied out on
  // Same GPU, another process: the input region's two words (else null)
  // that pipeline the dispatches; the last value written.
  uint32_t* words_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint32_t seq_ ABSL_GUARDED_BY(mu_) = 0;
};

class CudaIpcTransport : public Transport {
 public:
  explicit CudaIpcTransport(const CudaIpcTransportOptions& options) : options_(options) {}
  absl::string_view name() const override { return "cuda_ipc"; }

  absl::StatusOr<std::unique_ptr<DataChannel>> Connect(const std::string& address) override {
    ASSIGN_OR_RETURN(std::unique_ptr<ShmDoorbell> doorbell, ShmDoorbell::Create());
    auto stub = v1::IpcDataPlane::NewStub(CreateInternalChannel(address));
    auto ctx = std::make_unique<grpc::ClientContext>();
    std::unique_ptr<ClientStream> stream = stub->Attach(ctx.get());
    v1::IpcFrame hello;
    hello.set_doorbell(doorbell->name());
    hello.set_client(absl::StrCat("pid ", getpid(), " cuda:", options_.device));
    hello.set_pid(getpid());
    hello.set_device(options_.device);
    hello.set_process_token(ProcessToken());
    v1::IpcFrame ack;
    // Bounded: a server that never answers is cancelled at the deadline.
    std::atomic<bool> answered{false};
    grpc::ClientContext* raw = ctx.get();
    std::thread timer([&] {
      const absl::Time deadline = absl::Now() + options_.connect_timeout;
      while (!answered.load() && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
      if (!answered.load()) raw->TryCancel();
    });
    const bool ok = stream->Write(hello) && stream->Read(&ack);
    answered.store(true);
    timer.join();
    if (!ok) {
      const grpc::Status g = stream->Finish();
      const absl::Status s =
          g.ok() ? absl::UnavailableError("closed the channel") : FromGrpcStatus(g);
      return absl::Status(s.code(), absl::StrCat("cuda_ipc peer ", address, ": ", s.message()));
    }
    doorbell->Unlink();  // the server has it open
    ASSIGN_OR_RETURN(std::unique_ptr<Transport> grpc, MakeTransport("grpc"));
    ASSIGN_OR_RETURN(std::unique_ptr<DataChannel> host, grpc->Connect(address));
    return std::unique_ptr<DataChannel>(new IpcChannel(
        address, ack.device(), ack.process_token() == ProcessToken(), options_, std::move(host),
        std::move(stub), std::move(ctx), std::move(stream), std::move(doorbell)));
  }

 private:
  const CudaIpcTransportOptions options_;
};

}  // namespace

std::unique_ptr<Transport> MakeCudaIpcTransport(const CudaIpcTransportOptions& options) {
  return std::make_unique<CudaIpcTransport>(options);
}

// ---------------------------------------------------------------------------
// Server.

struct CudaIpcDataPlaneServer::Attachment {
  std::string client;
  bool same_process = false;
  bool other_gpu = false;  // the client's regions live on another GPU
  std::unique_ptr<ShmDoorbell> doorbell;
  std::atomic<bool> stop{false};
  // Set by kAttach; only the serving thread touches them.
  std::unique_ptr<DeviceRegion> input, output;
  // With other_gpu: copies on this GPU. The experts read their rows many
  // times (gathered by expert), which over NVLink costs far more than one
  // bulk copy each way.
  std::unique_ptr<DeviceRegion> local_input, local_output;
  char* input_base = nullptr;
  float* output_base = nullptr;
  int capacity = 0, hidden = 0, top_k = 0;
  uint32_t* flags = nullptr;  // the client's words (ready, done) in the input region: pipelined
  uint32_t last_sync = 0;     // the last pipelined dispatch's value
  int last_layer = -1;        // and its layer
  int lane = 0;  // its dispatches' MoeDispatch::lane: clients do not wait on each other
};

absl::StatusOr<std::unique_ptr<CudaIpcDataPlaneServer>> CudaIpcDataPlaneServer::Start(
    const std::string& listen, int device, DispatchHandler* dispatch, KvHandler* kv) {
  // No CUDA needed until a client attaches device memory (host calls work anywhere).
  std::unique_ptr<CudaIpcDataPlaneServer> s(new CudaIpcDataPlaneServer(device, dispatch, kv));
  RETURN_IF_ERROR(s->listener_.Start(listen, {s.get(), &s->host_}));
  return s;
}

CudaIpcDataPlaneServer::~CudaIpcDataPlaneServer() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  for (Attachment* a : attachments_) a->stop.store(true);
}  // then listener_ stops the gRPC server

absl::StatusOr<DeviceMemory*> CudaIpcDataPlaneServer::memory() {
  absl::MutexLock lock(&mu_);
  if (memory_ == nullptr) {
    ASSIGN_OR_RETURN(memory_, OpenDeviceMemory(device_));
  }
  return memory_.get();
}

grpc::Status CudaIpcDataPlaneServer::Attach(
    grpc::ServerContext* ctx, grpc::ServerReaderWriter<v1::IpcFrame, v1::IpcFrame>* stream) {
  v1::IpcFrame hello;
  if (!stream->Read(&hello)) return grpc::Status::OK;
  Attachment a;
  a.client = hello.client();
  a.same_process = hello.process_token() == ProcessToken();
  a.other_gpu = hello.device() != device_;
  absl::StatusOr<std::unique_ptr<ShmDoorbell>> doorbell = ShmDoorbell::Open(hello.doorbell());
  if (!doorbell.ok()) return ToGrpcStatus(doorbell.status());
  a.doorbell = std::move(*doorbell);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "shutting down");
    attachments_.push_back(&a);
    a.lane = next_lane_++;
  }
  v1::IpcFrame ack;
  ack.set_device(device_);
  ack.set_pid(getpid());
  ack.set_process_token(ProcessToken());
  if (stream->Write(ack)) {
    std::thread serving([this, &a] { Serve(&a); });
    v1::IpcFrame frame;
    while (!ctx->IsCancelled() && stream->Read(&frame)) {  // until the client ends the stream
    }
    a.stop.store(true);
    serving.join();
    if (a.flags != nullptr && a.last_sync != 0) ReleaseLane(a);
  }
  absl::MutexLock lock(&mu_);
  attachments_.erase(std::find(attachments_.begin(), attachments_.end(), &a));
  return grpc::Status::OK;
}

void CudaIpcDataPlaneServer::ReleaseLane(const Attachment& a) {
  // A client gone mid-step may never have written `ready` for its last
  // dispatch, which would hold its lane (and a later client given the same
  // lane) forever: write it here, so the queued work runs (on inputs that no
  // longer matter), and drain the lane with an empty dispatch that waits
  // before the regions are unmapped.
  absl::StatusOr<DeviceMemory*> mem = memory();
  if (mem.ok()) (*mem)->WriteFlag(nullptr, a.flags, a.last_sync).IgnoreError();
  MoeDispatch drain;
  drain.layer = a.last_layer, drain.num_tokens = 0, drain.hidden = a.hidden, drain.top_k = a.top_k;
  drain.memory = DispatchMemory::CudaDevice(device_);
  drain.lane = a.lane;
  drain.hidden_states = a.input_base;
  if (absl::Status s = dispatch_->Dispatch(drain, a.output_base); !s.ok())
    std::cerr << "cuda_ipc data plane: draining " << a.client << "'s lane: " << s << std::endl;
}

void CudaIpcDataPlaneServer::Serve(Attachment* a) {
  while (true) {
    absl::StatusOr<std::string> request = a->doorbell->WaitRequest(&a->stop);
    if (!request.ok()) return;  // stopped
    a->doorbell->Reply(Handle(a, *request));
  }
}

std::string CudaIpcDataPlaneServer::Handle(Attachment* a, const std::string& bytes) {
  IpcRequest r;
  if (!FromBytes(bytes, &r))
    return Bytes(ReplyOf(absl::InvalidArgumentError("an unreadable doorbell request")));
  if (r.kind == IpcRequest::kAttach) {
    a->input.reset(), a->output.reset(), a->local_input.reset(), a->local_output.reset();
    a->input_base = nullptr, a->output_base = nullptr, a->flags = nullptr;
    const InputLayout in(r.capacity, r.hidden, r.top_k);
    if (r.capacity <= 0 || r.hidden <= 0 || r.top_k <= 0 || r.input_bytes < in.bytes ||
        r.output_bytes < static_cast<uint64_t>(r.capacity) * r.hidden * sizeof(float)) {
      return Bytes(ReplyOf(
          absl::InvalidArgumentError("cuda_ipc attach: regions too small for their shape")));
    }
    if (a->same_process) {
      a->input_base = reinterpret_cast<char*>(r.input_ptr);
      a->output_base = reinterpret_cast<float*>(r.output_ptr);
    } else {
      absl::StatusOr<DeviceMemory*> mem = memory();
      if (!mem.ok()) return Bytes(ReplyOf(mem.status()));
      absl::StatusOr<std::unique_ptr<DeviceRegion>> input = (*mem)->Import(
          std::string(r.input_handle, std::min<size_t>(r.input_handle_size, kMaxHandle)),
          r.input_bytes);
      if (!input.ok()) return Bytes(ReplyOf(input.status()));
      absl::StatusOr<std::unique_ptr<DeviceRegion>> output = (*mem)->Import(
          std::string(r.output_handle, std::min<size_t>(r.output_handle_size, kMaxHandle)),
          r.output_bytes);
      if (!output.ok()) return Bytes(ReplyOf(output.status()));
      a->input = std::move(*input), a->output = std::move(*output);
      a->input_base = static_cast<char*>(a->input->data());
      a->output_base = static_cast<float*>(a->output->data());
    }
    if (a->other_gpu) {
      absl::StatusOr<DeviceMemory*> mem = memory();
      absl::StatusOr<std::unique_ptr<DeviceRegion>> li =
          mem.ok() ? (*mem)->Export(r.input_bytes)
                   : absl::StatusOr<std::unique_ptr<DeviceRegion>>(mem.status());
      if (!li.ok()) return Bytes(ReplyOf(li.status()));
      absl::StatusOr<std::unique_ptr<DeviceRegion>> lo = (*mem)->Export(r.output_bytes);
      if (!lo.ok()) return Bytes(ReplyOf(lo.status()));
      a->local_input = std::move(*li), a->local_output = std::move(*lo);
    }
    if (r.flags_offset != 0) {
      if (a->same_process || a->other_gpu || r.flags_offset % 4 != 0 ||
          r.flags_offset > r.input_bytes - 2 * sizeof(uint32_t)) {
        return Bytes(ReplyOf(absl::InvalidArgumentError(
            "cuda_ipc attach: device flags need another process on this GPU and two words "
            "inside the input region")));
      }
      a->flags = reinterpret_cast<uint32_t*>(a->input_base + r.flags_offset);
    }
    a->capacity = r.capacity, a->hidden = r.hidden, a->top_k = r.top_k;
    std::cerr << "cuda_ipc data plane: " << a->client << " attached device buffers for "
              << r.capacity << " tokens" << (a->same_process ? " (same process)" : "")
              << (a->other_gpu ? " (its GPU: staged through this one)" : "")
              << (a->flags != nullptr ? " (pipelined on the device through device flags)" : "")
              << std::endl;
    if (!a->same_process && !a->other_gpu && std::getenv("CUDA_MPS_PIPE_DIRECTORY") == nullptr) {
      std::cerr << "cuda_ipc data plane: note: the client shares this GPU: unless MPS runs it, "
                   "every dispatch costs a GPU "
                   "context switch each way (~0.3 ms per call measured on an H200; BENCHMARKS.md)"
                << std::endl;
    }
    return Bytes(ReplyOf(absl::OkStatus()));
  }
  if (r.kind != IpcRequest::kDispatch)
    return Bytes(ReplyOf(absl::InvalidArgumentError("an unknown doorbell request")));
  if (dispatch_ == nullptr)
    return Bytes(ReplyOf(absl::UnimplementedError("this worker takes no expert dispatch")));
  if (a->input_base == nullptr)
    return Bytes(ReplyOf(absl::FailedPreconditionError("dispatch before attach")));
  if (r.num_tokens < 0 || r.num_tokens > a->capacity || r.hidden != a->hidden ||
      r.top_k != a->top_k || r.num_experts < 0 || r.num_experts > kMaxExperts) {
    return Bytes(ReplyOf(absl::InvalidArgumentError(
        absl::StrCat("cuda_ipc dispatch of ", r.num_tokens, " x ", r.hidden, " top-", r.top_k,
                     " into regions for ", a->capacity, " x ", a->hidden, " top-", a->top_k))));
  }
  const InputLayout in(a->capacity, a->hidden, a->top_k);
  const size_t t = r.num_tokens;
  char* input = a->input_base;
  float* output = a->output_base;
  if (a->local_input != nullptr && t > 0) {  // pull the rows over in bulk
    input = static_cast<char*>(a->local_input->data());
    output = static_cast<float*>(a->local_output->data());
    const DeviceMemory::CopyRange pull[] = {
        {input, a->input_base, t * r.hidden * 2},
        {input + in.ids, a->input_base + in.ids, t * r.top_k * sizeof(int32_t)},
        {input + in.weights, a->input_base + in.weights, t * r.top_k * sizeof(float)}};
    if (absl::Status s = (*memory())->Copy(pull); !s.ok()) return Bytes(ReplyOf(s));
  }
  MoeDispatch d;
  d.layer = r.layer, d.num_tokens = r.num_tokens, d.hidden = r.hidden, d.top_k = r.top_k;
  d.memory = DispatchMemory::CudaDevice(device_);
  d.hidden_states = input;
  d.topk_ids = reinterpret_cast<const int32_t*>(input + in.ids);
  d.topk_weights = reinterpret_cast<const float*>(input + in.weights);
  d.serve = r.num_experts > 0 ? r.serve : nullptr;
  d.num_experts = r.num_experts;
  d.lane = a->lane;
  if (r.sync_value != 0) {  // pipelined
    if (a->local_input != nullptr || a->flags == nullptr) {
      return Bytes(ReplyOf(
          absl::FailedPreconditionError("a pipelined dispatch on an attachment without flags")));
    }
    d.ready_flag = a->flags, d.done_flag = a->flags + 1, d.sync_value = r.sync_value;
  }
  absl::Status s = dispatch_->Dispatch(d, output);
  if (s.ok() && d.done_flag != nullptr) a->last_sync = d.sync_value, a->last_layer = d.layer;
  if (s.ok() && output != a->output_base && t > 0) {  // push the sums back in bulk
    const DeviceMemory::CopyRange push[] = {{a->output_base, output, t * r.hidden * sizeof(float)}};
    s = (*memory())->Copy(push);
  }
  return Bytes(ReplyOf(s));
}

// Processes of one node share device memory; a worker without dispatch
// handlers (decode: KV only) stays on gRPC.
const TransportPlugin& CudaIpcTransportPlugin() {
  static const BasicTransportPlugin plugin =
      DeviceTransportPlugin("cuda_ipc", MakeCudaIpcTransport, [](const DataPlaneServeOptions& o) {
        return CudaIpcDataPlaneServer::Start(o.host + ":0", o.cuda_device, o.dispatch, o.kv);
      });
  return plugin;
}

}  // namespace moesh
