// Reusable threads for blocking work (RPCs, transfers): Schedule runs a task
// on an idle thread of the pool and starts a new thread only when none is
// idle, so threads are made as concurrency grows, not per call, and a task
// never waits for a thread (tasks may block on one another without
// deadlock). Threads live until the pool goes.
//
// Thread-safe. The destructor runs the tasks already scheduled, then joins.
#ifndef MOESH_COMMON_BASE_THREAD_POOL_H_
#define MOESH_COMMON_BASE_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace moesh {

class ThreadPool {
 public:
  ThreadPool() = default;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;
  ~ThreadPool();

  void Schedule(std::function<void()> task);
  // Threads made so far, and those waiting for a task now.
  int num_threads() const;
  int num_idle() const;

 private:
  void Loop();

  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;  // threads waiting for a task
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace moesh

#endif  // MOESH_COMMON_BASE_THREAD_POOL_H_
