#include "base/thread_pool.h"

namespace moesh {

ThreadPool::~ThreadPool() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  // Every queued task needs a thread of its own that is free for it now.
  if (static_cast<int>(queue_.size()) > idle_) threads_.emplace_back([this] { Loop(); });
}

int ThreadPool::num_threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

int ThreadPool::num_idle() const {
  absl::MutexLock lock(&mu_);
  return idle_;
}

void ThreadPool::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    ++idle_;
    mu_.Await(absl::Condition(
        +[](ThreadPool* p)
             ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return !p->queue_.empty() || p->stopping_; },
        this));
    --idle_;
    if (queue_.empty()) return;  // stopping, nothing left
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    task();
    mu_.Lock();
  }
}

}  // namespace moesh
