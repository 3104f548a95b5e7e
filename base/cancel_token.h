// A one-shot cancellation signal that waiters learn of by callback, not by
// polling: whoever owns the token calls Cancel() (a client went away, an
// Abort RPC, a deadline); whoever waits on work for it registers a callback
// with OnCancel() that wakes the wait (notifies a condition, cancels an RPC
// with ClientContext::TryCancel, marks a request for its engine).
//
// Contract:
// - Cancel() is idempotent; the first call runs every registered callback once,
//   on the calling thread, in registration order, with no lock of the token
//   held (a callback may take its own locks, register or drop callbacks).
//   Callers must not hold a lock that a callback takes.
// - OnCancel(fn) runs fn at once, on the calling thread, if the token was
//   already cancelled; else fn runs in Cancel(). The returned Registration
//   drops the callback when it goes (or on Reset()); if Cancel() is running
//   that callback on another thread just then, it waits for it to return, so
//   what fn captured may be destroyed right after. (A callback may drop its
//   own registration: no wait on its own thread.)
// - The token must outlive its registrations. Thread-safe.
//
// Observers take `const CancelToken&`: they can wait on it, not cancel it.
#ifndef MOESH_BASE_CANCEL_TOKEN_H_
#define MOESH_BASE_CANCEL_TOKEN_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

namespace moesh {

class CancelToken {
 public:
  class Registration {
   public:
    Registration() = default;
    Registration(Registration&& o) noexcept : token_(o.token_), id_(o.id_) { o.token_ = nullptr; }
    Registration& operator=(Registration&& o) noexcept {
      if (this != &o) {
        Reset();
        token_ = std::exchange(o.token_, nullptr);
        id_ = o.id_;
      }
      return *this;
    }
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    ~Registration() { Reset(); }
    // Drops the callback now (see the contract above).
    void Reset() {
      if (token_ != nullptr) std::exchange(token_, nullptr)->Drop(id_);
    }

   private:
    friend class CancelToken;
    Registration(const CancelToken* token, uint64_t id) : token_(token), id_(id) {}
    const CancelToken* token_ = nullptr;
    uint64_t id_ = 0;
  };

  CancelToken() = default;
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  void Cancel() {
    std::unique_lock<std::mutex> lock(mu_);
    if (cancelled_.exchange(true)) return;
    while (!callbacks_.empty()) {
      auto first = callbacks_.begin();
      std::function<void()> fn = std::move(first->second);
      running_ = first->first;
      running_on_ = std::this_thread::get_id();
      callbacks_.erase(first);
      lock.unlock();
      fn();
      lock.lock();
      running_ = 0;
      ran_.notify_all();
    }
  }

  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }

  [[nodiscard]] Registration OnCancel(std::function<void()> fn) const {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!cancelled_.load()) {
        const uint64_t id = ++next_id_;
        callbacks_.emplace(id, std::move(fn));
        return Registration(this, id);
      }
    }
    fn();
    return Registration();
  }

 private:
  void Drop(uint64_t id) const {
    std::unique_lock<std::mutex> lock(mu_);
    if (callbacks_.erase(id) > 0) return;
    // Running (or ran): wait for it unless it is this thread that runs it.
    if (running_on_ != std::this_thread::get_id()) ran_.wait(lock, [&] { return running_ != id; });
  }

  mutable std::mutex mu_;
  mutable std::condition_variable ran_;
  std::atomic<bool> cancelled_{false};
  mutable std::map<uint64_t, std::function<void()>> callbacks_;  // by registration order
  mutable uint64_t next_id_ = 0;
  uint64_t running_ = 0;  // the callback Cancel() runs now, 0: none
  std::thread::id running_on_;
};

}  // namespace moesh

#endif  // MOESH_BASE_CANCEL_TOKEN_H_
