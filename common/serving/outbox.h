// A request's token events on their way from the decode engine's loop to
// the thread relaying them (DecodeEngine::Decode), behind a lock of its own:
// a step's tokens wake their readers alone, and the engine's lock is not the
// one a hundred readers wait on (an absl::Mutex unlock evaluates its waiters'
// conditions: every reader waiting on the engine's lock made each unlock,
// the engine loop's included, scan them all). The engine pushes and closes;
// one reader takes. Thread-safe.
#ifndef MOESH_COMMON_SERVING_OUTBOX_H_
#define MOESH_COMMON_SERVING_OUTBOX_H_

#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/serving/generation_flow.h"

namespace moesh {

class Outbox {
 public:
  void Push(TokenEvent e) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(e));
  }
  // No more events: the request ended. Events pushed before still reach Take.
  void Close() {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }
  // Waits for events or the end; takes the events. *closed: none will follow.
  std::deque<TokenEvent> Take(bool* closed) {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](Outbox* o)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(o->mu_) { return !o->events_.empty() || o->closed_; },
        this));
    *closed = closed_;
    return std::exchange(events_, {});
  }

 private:
  absl::Mutex mu_;
  std::deque<TokenEvent> events_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace moesh

#endif  // MOESH_COMMON_SERVING_OUTBOX_H_
