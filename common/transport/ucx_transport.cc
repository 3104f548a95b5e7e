#include "common/transport/ucx_transport.h"

#include <arpa/inet.h>

#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/status.h"
#include "common/transport/dispatch_wire.h"
#include "common/transport/kv_wire.h"
#include "common/transport/transport_registry.h"
#include "common/transport/ucx_worker.h"

namespace moesh {
namespace {

enum Method : uint32_t { kDispatch = 1, kPushKv = 2, kReply = 3 };

struct Header {
  uint64_t id = 0;
  uint32_t method = 0;
  int32_t code = 0;  // absl::StatusCode of a reply
};

constexpr absl::Duration kCallDeadline = absl::Seconds(30);

// A message being received: eager data is copied at once; rendezvous data
// arrives into `data` and `on_complete` runs when it has.
struct Incoming {
  Header header;
  std::string data;
  ucp_ep_h reply_ep = nullptr;
  std::function<void(Incoming*)> on_complete;  // takes ownership
};

void RecvDone(void* request, ucs_status_t status, size_t, void* user_data) {
  auto* in = static_cast<Incoming*>(user_data);
  if (status != UCS_OK) in->header.code = static_cast<int32_t>(absl::StatusCode::kUnavailable);
  in->on_complete(in);
  if (request != nullptr) ucp_request_free(request);
}

// Shared AM receive path: returns UCS_OK; calls in->on_complete(in) once the
// payload is in memory.
ucs_status_t Receive(ucp_worker_h worker, const void* header, size_t header_length, void* data,
                     size_t length, const ucp_am_recv_param_t* param, Incoming* in) {
  if (header_length == sizeof(Header)) std::memcpy(&in->header, header, sizeof(Header));
  if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) in->reply_ep = param->reply_ep;
  in->data.resize(length);
  if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
    ucp_request_param_t rp{};
    rp.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    rp.cb.recv_am = RecvDone;
    rp.user_data = in;
    ucs_status_ptr_t r = ucp_am_recv_data_nbx(worker, data, in->data.data(), length, &rp);
    if (r == nullptr) {
      in->on_complete(in);
    } else if (UCS_PTR_IS_ERR(r)) {
      in->header.code = static_cast<int32_t>(absl::StatusCode::kUnavailable);
      in->on_complete(in);
    }
    return UCS_OK;
  }
  if (length > 0) std::memcpy(in->data.data(), data, length);
  in->on_complete(in);
  return UCS_OK;
}

// An AM send whose header and payload live until completion.
struct Outgoing {
  Header header;
  std::string data;
  std::function<void(ucs_status_t)> done;
};

void SendDone(void* request, ucs_status_t status, void* user_data) {
  auto* out = static_cast<Outgoing*>(user_data);
  if (out->done) out->done(status);
  delete out;
  if (request != nullptr) ucp_request_free(request);
}

// REQUIRES: on the worker's progress thread.
void Send(ucp_ep_h ep, uint16_t am_id, Outgoing* out, bool want_reply) {
  ucp_request_param_t sp{};
  sp.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  sp.flags = want_reply ? UCP_AM_SEND_FLAG_REPLY : 0;
  sp.cb.send = SendDone;
  sp.user_data = out;
  ucs_status_ptr_t r = ucp_am_send_nbx(ep, am_id, &out->header, sizeof(Header), out->data.data(),
                                       out->data.size(), &sp);
  if (r == nullptr) {
    SendDone(nullptr, UCS_OK, out);
  } else if (UCS_PTR_IS_ERR(r)) {
    SendDone(nullptr, UCS_PTR_STATUS(r), out);
  }
}

// ---------------------------------------------------------------------------
// Client.

class UcxTransportImpl;

struct Peer {
  std::string address;
  ucp_ep_h ep = nullptr;  // progress thread only
  bool failed = false;    // progress thread only
};

class UcxTransportImpl : public Transport {
 public:
  explicit UcxTransportImpl(std::unique_ptr<UcxWorker> worker) : worker_(std::move(worker)) {
    worker_->Run([this] { worker_->SetAmHandler(UcxWorker::kReplyAm, &OnReply, this); });
  }
  ~UcxTransportImpl() override {
    worker_->Run([this] {
      for (auto& [address, peer] : peers_) CloseEp(peer.get());
    });
    worker_.reset();
  }
  absl::string_view name() const override { return "ucx"; }
  absl::StatusOr<std::unique_ptr<DataChannel>> Connect(const std::string& address) override;

  // Sends `payload` to `peer` and waits for the reply.
  absl::Status Call(Peer* peer, Method method, std::string payload, std::string* reply);

 private:
  struct Pending {
    Peer* peer = nullptr;
    bool done = false;
    absl::Status status;
    std::string reply;
  };

  static ucs_status_t OnReply(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxTransportImpl*>(arg);
    auto* in = new Incoming();
    in->on_complete = [self](Incoming* in) {
      absl::Status status =
          in->header.code == 0
              ? absl::OkStatus()
              : absl::Status(static_cast<absl::StatusCode>(in->header.code), in->data);
      self->Complete(in->header.id, std::move(status), std::move(in->data));
      delete in;
    };
    return Receive(self->worker_->worker(), header, header_length, data, length, param, in);
  }

  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* peer_and_self = static_cast<std::pair<UcxTransportImpl*, Peer*>*>(arg);
    UcxTransportImpl* self = peer_and_self->first;
    Peer* peer = peer_and_self->second;
    peer->failed = true;
    self->FailPeer(peer, UcxError(absl::StrCat("connection to ", peer->address), status));
  }

  // Progress thread: (re)connects peer->ep.
  absl::Status EnsureEp(Peer* peer);
  void CloseEp(Peer* peer);
  void Complete(uint64_t id, absl::Status status, std::string reply);
  void FailPeer(Peer* peer, const absl::Status& status);

  std::unique_ptr<UcxWorker> worker_;
  std::atomic<uint64_t> next_id_{1};
  absl::Mutex mu_;
  std::map<uint64_t, Pending*> pending_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  std::map<Peer*, std::unique_ptr<std::pair<UcxTransportImpl*, Peer*>>>
      err_args_;  // progress thread
};

class UcxChannel : public DataChannel {
 public:
  UcxChannel(UcxTransportImpl* transport, Peer* peer) : transport_(transport), peer_(peer) {}
  absl::Status Dispatch(const MoeDispatch& dispatch, float* out) override {
    RETURN_IF_ERROR(CheckHostDispatch(dispatch, peer()));
    v1::DispatchRequest request;
    EncodeDispatchRequest(dispatch, &request);
    std::string reply;
    absl::Status s = transport_->Call(peer_, kDispatch, request.SerializeAsString(), &reply);
    if (!s.ok()) return s;
    v1::DispatchResponse response;
    if (!response.ParseFromString(reply))
      return absl::DataLossError("UCX: malformed dispatch reply");
    return DecodeDispatchResponse(response, dispatch, peer_->address, out);
  }
  absl::Status PushKv(const KvTransfer& transfer) override {
    v1::PushKvRequest request;
    EncodePushKv(transfer, &request);
    std::string reply;
    return transport_->Call(peer_, kPushKv, request.SerializeAsString(), &reply);
  }
  const std::string& peer() const override { return peer_->address; }

 private:
  UcxTransportImpl* const transport_;
  Peer* const peer_;
};

absl::StatusOr<std::unique_ptr<DataChannel>> UcxTransportImpl::Connect(const std::string& address) {
  sockaddr_in sa;
  if (absl::Status s = ParseSockaddr(address, &sa); !s.ok()) return s;
  Peer* peer;
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Peer>& p = peers_[address];
    if (p == nullptr) {
      p = std::make_unique<Peer>();
      p->address = address;
    }
    peer = p.get();
  }
  return std::make_unique<UcxChannel>(this, peer);
}

absl::Status UcxTransportImpl::EnsureEp(Peer* peer) {
  if (peer->ep != nullptr && !peer->failed) return absl::OkStatus();
  if (peer->ep != nullptr) CloseEp(peer);
  sockaddr_in sa;
  if (absl::Status s = ParseSockaddr(peer->address, &sa); !s.ok()) return s;
  auto& arg = err_args_[peer];
  arg = std::make_unique<std::pair<UcxTransportImpl*, Peer*>>(this, peer);
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  ep.sockaddr.addrlen = sizeof(sa);
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxTransportImpl::OnEpError;
  ep.err_handler.arg = arg.get();
  const ucs_status_t s = ucp_ep_create(worker_->worker(), &ep, &peer->ep);
  if (s != UCS_OK) {
    peer->ep = nullptr;
    return UcxError(absl::StrCat("connect to ", peer->address), s);
  }
  peer->failed = false;
  return absl::OkStatus();
}

void UcxTransportImpl::CloseEp(Peer* peer) {
  if (peer->ep == nullptr) return;
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(peer->ep, &p);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) {
    while (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_worker_progress(worker_->worker());
    ucp_request_free(r);
  }
  peer->ep = nullptr;
}

void UcxTransportImpl::Complete(uint64_t id, absl::Status status, std::string reply) {
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(id);
  if (it == pending_.end()) return;  // timed out meanwhile
  it->second->status = std::move(status);
  it->second->reply = std::move(reply);
  it->second->done = true;
  pending_.erase(it);
}

void UcxTransportImpl::FailPeer(Peer* peer, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second->peer == peer) {
      it->second->status = status;
      it->second->done = true;
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status UcxTransportImpl::Call(Peer* peer, Method method, std::string payload,
                                    std::string* reply) {
  const uint64_t id = next_id_++;
  Pending p;
  p.peer = peer;
  {
    absl::MutexLock lock(&mu_);
    pending_[id] = &p;
  }
  worker_->Post([this, peer, id, method, payload = std::move(payload)]() mutable {
    absl::Status s = EnsureEp(peer);
    if (!s.ok()) {
      Complete(id, s, "");
      return;
    }
    auto* out = new Outgoing();
    out->header.id = id;
    out->header.method = method;
    out->data = std::move(payload);
    out->done = [this, id, peer](ucs_status_t st) {
      if (st != UCS_OK) Complete(id, UcxError(absl::StrCat("send to ", peer->address), st), "");
    };
    Send(peer->ep, UcxWorker::kRequestAm, out, /*want_reply=*/true);
  });
  absl::MutexLock lock(&mu_);
  if (!mu_.AwaitWithTimeout(absl::Condition(&p.done), kCallDeadline)) {
    pending_.erase(id);
    return absl::DeadlineExceededError(absl::StrCat("UCX call to ", peer->address, " timed out"));
  }
  if (p.status.ok()) *reply = std::move(p.reply);
  return p.status;
}

// ---------------------------------------------------------------------------
// Server.

class UcxServerImpl : public UcxDataPlaneServer {
 public:
  UcxServerImpl(std::unique_ptr<UcxWorker> worker, DispatchHandler* dispatch, KvHandler* kv)
      : worker_(std::move(worker)), dispatch_(dispatch), kv_(kv) {
    for (int i = 0; i < kHandlerThreads; ++i) pool_.emplace_back([this] { HandlerLoop(); });
  }
  ~UcxServerImpl() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    for (auto& t : pool_) t.join();
    worker_->Run([this] {
      if (listener_ != nullptr) ucp_listener_destroy(listener_);
      for (ucp_ep_h ep : eps_) {
        ucp_request_param_t p{};
        p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = UCP_EP_CLOSE_FLAG_FORCE;
        ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
        if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
      }
      eps_.clear();
    });
    worker_.reset();
  }
  int port() const override { return port_; }

  absl::Status Listen(const std::string& listen) {
    sockaddr_in sa;
    if (absl::Status s = ParseSockaddr(listen, &sa); !s.ok()) return s;
    absl::Status result;
    worker_->Run([&] {
      ucs_status_t s = worker_->SetAmHandler(UcxWorker::kRequestAm, &OnRequest, this);
      if (s != UCS_OK) {
        result = UcxError("AM handler", s);
        return;
      }
      ucp_listener_params_t lp{};
      lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
      lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
      lp.sockaddr.addrlen = sizeof(sa);
      lp.conn_handler.cb = &UcxServerImpl::OnConnection;
      lp.conn_handler.arg = this;
      s = ucp_listener_create(worker_->worker(), &lp, &listener_);
      if (s != UCS_OK) {
        result = UcxError(absl::StrCat("listen on ", listen), s);
        return;
      }
      ucp_listener_attr_t attr{};
      attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
      s = ucp_listener_query(listener_, &attr);
      if (s != UCS_OK) {
        result = UcxError("listener query", s);
        return;
      }
      port_ = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
    });
    return result;
  }

 private:
  static constexpr int kHandlerThreads = 16;

  static void OnConnection(ucp_conn_request_h request, void* arg) {
    auto* self = static_cast<UcxServerImpl*>(arg);
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.conn_request = request;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &UcxServerImpl::OnEpError;
    ep.err_handler.arg = self;
    ucp_ep_h h;
    if (ucp_ep_create(self->worker_->worker(), &ep, &h) == UCS_OK) self->eps_.insert(h);
  }

  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t) {
    auto* self = static_cast<UcxServerImpl*>(arg);
    // A client went away: forget its endpoint (replies to it are dropped).
    if (self->eps_.erase(ep)) {
      ucp_request_param_t p{};
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
      if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
    }
  }

  static ucs_status_t OnRequest(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
    auto* self = static_cast<UcxServerImpl*>(arg);
    auto* in = new Incoming();
    in->on_complete = [self](Incoming* in) {
      absl::MutexLock lock(&self->mu_);
      self->queue_.push_back(std::unique_ptr<Incoming>(in));
    };
    return Receive(self->worker_->worker(), header, header_length, data, length, param, in);
  }

  void HandlerLoop() {
    while (true) {
      std::unique_ptr<Incoming> in;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
        mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        in = std::move(queue_.front());
        queue_.pop_front();
      }
      auto* out = new Outgoing();
      out->header.id = in->header.id;
      out->header.method = kReply;
      absl::Status s = Handle(*in, &out->data);
      if (!s.ok()) {
        out->header.code = static_cast<int32_t>(s.code());
        out->data = std::string(s.message());
      }
      ucp_ep_h ep = in->reply_ep;
      worker_->Post([this, ep, out] {
        if (ep == nullptr || !eps_.count(ep)) {
          delete out;  // the client is gone
          return;
        }
        Send(ep, UcxWorker::kReplyAm, out, /*want_reply=*/false);
      });
    }
  }

  absl::Status Handle(const Incoming& in, std::string* reply) {
    if (in.header.code != 0) return absl::UnavailableError("UCX: request payload lost");
    switch (in.header.method) {
      case kDispatch: {
        if (dispatch_ == nullptr) return absl::UnimplementedError("this worker hosts no experts");
        v1::DispatchRequest req;
        if (!req.ParseFromString(in.data))
          return absl::InvalidArgumentError("UCX: malformed dispatch request");
        v1::DispatchResponse resp;
        if (absl::Status s = ServeDispatch(*dispatch_, req, &resp); !s.ok()) return s;
        *reply = resp.SerializeAsString();
        return absl::OkStatus();
      }
      case kPushKv: {
        if (kv_ == nullptr) return absl::UnimplementedError("this worker takes no KV");
        v1::PushKvRequest req;
        if (!req.ParseFromString(in.data))
          return absl::InvalidArgumentError("UCX: malformed KV message");
        return ServePushKv(*kv_, req);
      }
      default:
        return absl::InvalidArgumentError(absl::StrCat("UCX: unknown method ", in.header.method));
    }
  }

  std::unique_ptr<UcxWorker> worker_;
  DispatchHandler* const dispatch_;
  KvHandler* const kv_;
  ucp_listener_h listener_ = nullptr;  // progress thread
  std::set<ucp_ep_h> eps_;             // progress thread
  int port_ = 0;

  absl::Mutex mu_;
  std::deque<std::unique_ptr<Incoming>> queue_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> pool_;
};

}  // namespace

std::unique_ptr<Transport> MakeUcxTransport() {
  absl::StatusOr<std::unique_ptr<UcxWorker>> w = UcxWorker::Create("moesh-client");
  if (!w.ok()) return nullptr;
  return std::make_unique<UcxTransportImpl>(std::move(*w));
}

absl::StatusOr<std::unique_ptr<UcxDataPlaneServer>> UcxDataPlaneServer::Start(
    const std::string& listen, DispatchHandler* dispatch, KvHandler* kv) {
  absl::StatusOr<std::unique_ptr<UcxWorker>> w = UcxWorker::Create("moesh-server");
  if (!w.ok()) return w.status();
  auto server = std::make_unique<UcxServerImpl>(std::move(*w), dispatch, kv);
  if (absl::Status s = server->Listen(listen); !s.ok()) return s;
  return std::unique_ptr<UcxDataPlaneServer>(std::move(server));
}

// A UCX listener of its own beside the worker's gRPC server.
const TransportPlugin& UcxTransportPlugin() {
  static const BasicTransportPlugin plugin(
      "ucx", {},
      [](int) -> absl::StatusOr<std::unique_ptr<Transport>> {
        std::unique_ptr<Transport> t = MakeUcxTransport();
        if (t == nullptr)
          return absl::UnavailableError("cannot initialise UCX (see UCX_* environment variables)");
        return t;
      },
      [](const DataPlaneServeOptions& o) -> absl::StatusOr<DataPlaneEndpoint> {
        ASSIGN_OR_RETURN(std::unique_ptr<UcxDataPlaneServer> s,
                         UcxDataPlaneServer::Start(o.host + ":0", o.dispatch, o.kv));
        return ListenerEndpoint(o.host, std::move(s));
      });
  return plugin;
}

}  // namespace moesh
