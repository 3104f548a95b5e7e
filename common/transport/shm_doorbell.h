// A doorbell between two processes of one host: one call at a time, the
// client posts a request (bytes), the server takes it, works, and posts the
// reply. It lives in a POSIX shared-memory segment the client creates; the
// server opens it by name. The cuda_ipc transport rings it once per MoE
// layer, so waiting spins (then yields, then sleeps): microseconds per call
// while calls keep coming, no CPU once they stop.
//
// Thread-safety: one client thread and one server thread; `abort`/`stop`
// flags may be set from any thread.
#ifndef MOESH_COMMON_TRANSPORT_SHM_DOORBELL_H_
#define MOESH_COMMON_TRANSPORT_SHM_DOORBELL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace moesh {

class ShmDoorbell {
 public:
  static constexpr size_t kMaxMessage = 4096;

  // Client: a new segment with a fresh name (unlinked again on destruction
  // or Unlink). Server: the client's segment.
  static absl::StatusOr<std::unique_ptr<ShmDoorbell>> Create();
  static absl::StatusOr<std::unique_ptr<ShmDoorbell>> Open(const std::string& name);
  ~ShmDoorbell();
  ShmDoorbell(const ShmDoorbell&) = delete;
  ShmDoorbell& operator=(const ShmDoorbell&) = delete;

  const std::string& name() const { return name_; }
  // Removes the name (the mapping stays): call once the server has opened it.
  void Unlink();

  // Client. Post: INVALID_ARGUMENT over kMaxMessage, FAILED_PRECONDITION
  // while a call is outstanding. WaitReply: the reply to the last Post;
  // DEADLINE_EXCEEDED past `deadline`, UNAVAILABLE once `*abort` is set (the
  // call then stays outstanding: the channel is broken).
  absl::Status Post(absl::string_view request);
  absl::StatusOr<std::string> WaitReply(absl::Time deadline, const std::atomic<bool>* abort);

  // Server. WaitRequest: the next request, or CANCELLED once `*stop` is set.
  // Reply answers it.
  absl::StatusOr<std::string> WaitRequest(const std::atomic<bool>* stop);
  void Reply(absl::string_view reply);

 private:
  struct Block;
  ShmDoorbell(std::string name, Block* block, bool owner)
      : name_(std::move(name)), block_(block), owner_(owner) {}

  const std::string name_;
  Block* const block_;
  bool owner_;        // the client, until Unlink
  uint64_t seq_ = 0;  // client: last posted; server: last taken
  bool outstanding_ = false;
};

}  // namespace moesh

#endif  // MOESH_COMMON_TRANSPORT_SHM_DOORBELL_H_
