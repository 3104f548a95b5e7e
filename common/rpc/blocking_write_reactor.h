// A server-streaming RPC on gRPC's callback API whose handler thread writes
// as the sync API did: Write blocks until the message went out (or the
// client is gone), so the handler owns its message buffers for the call's
// duration. The client cancelling (or its deadline passing) calls
// `on_cancel` on a gRPC thread, at once: cancellation is an event, not a poll.
// The reactor deletes itself when gRPC is done with it, so Finish is the
// last thing the handler's thread does with it.
//
//   auto* stream = new BlockingWriteReactor<Resp>([token] { token->Cancel(); });
//   pool.Schedule([stream] { ...; stream->Write(m); ...; stream->Finish(status); });
//   return stream;
#ifndef MOESH_COMMON_RPC_BLOCKING_WRITE_REACTOR_H_
#define MOESH_COMMON_RPC_BLOCKING_WRITE_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <functional>
#include <mutex>
#include <utility>

namespace moesh {

template <typename Response>
class BlockingWriteReactor final : public grpc::ServerWriteReactor<Response> {
 public:
  explicit BlockingWriteReactor(std::function<void()> on_cancel)
      : on_cancel_(std::move(on_cancel)) {}

  // Sends `m`; false once the client is gone (then no later Write sends).
  bool Write(const Response& m) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!write_ok_) return false;
    writing_ = true;
    lock.unlock();
    this->StartWrite(&m);
    lock.lock();
    written_.wait(lock, [this] { return !writing_; });
    return write_ok_;
  }

 private:
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    write_ok_ = write_ok_ && ok;
    written_.notify_all();
  }
  void OnCancel() override { on_cancel_(); }
  void OnDone() override { delete this; }

  const std::function<void()> on_cancel_;
  std::mutex mu_;
  std::condition_variable written_;
  bool writing_ = false;
  bool write_ok_ = true;
};

}  // namespace moesh

#endif  // MOESH_COMMON_RPC_BLOCKING_WRITE_REACTOR_H_
