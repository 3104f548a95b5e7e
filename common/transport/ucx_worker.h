// RAII ownership of a UCX context + worker driven by one progress thread.
// Every UCX call happens on that thread: other threads Post() closures, which
// wake the thread through ucp_worker_signal. Thread-safe (Post); the UCX
// handles themselves are only touched on the progress thread.
#ifndef MOESH_COMMON_TRANSPORT_UCX_WORKER_H_
#define MOESH_COMMON_TRANSPORT_UCX_WORKER_H_

#include <netinet/in.h>
#include <ucp/api/ucp.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace moesh {

// "UCX <what>: <ucs_status_string>" as UNAVAILABLE (peer/transport errors).
absl::Status UcxError(const std::string& what, ucs_status_t status);

class UcxWorker {
 public:
  // Active-message ids moesh uses.
  static constexpr uint16_t kRequestAm = 1;
  static constexpr uint16_t kReplyAm = 2;

  static absl::StatusOr<std::unique_ptr<UcxWorker>> Create(const std::string& name);
  ~UcxWorker();  // stops the thread, then destroys the worker and context

  ucp_worker_h worker() const { return worker_; }
  // Runs `task` on the progress thread (in order).
  void Post(std::function<void()> task);
  // Runs `task` on the progress thread and waits for it.
  void Run(std::function<void()> task);
  bool OnProgressThread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // Has `cb` called with `arg` for each active message `id` (on the progress
  // thread).
  ucs_status_t SetAmHandler(uint16_t id, ucp_am_recv_callback_t cb, void* arg);

 private:
  UcxWorker() = default;
  void Loop();

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  std::thread thread_;

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

// "host:port" -> sockaddr_in; INVALID_ARGUMENT if unparsable.
absl::Status ParseSockaddr(const std::string& address, struct sockaddr_in* out);

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_UCX_WORKER_H_
