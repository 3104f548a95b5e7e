#include "base/thread_pool.h"

#include <atomic>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

TEST(ThreadPoolTest, ReusesIdleThreads) {
  ThreadPool pool;
  for (int i = 0; i < 20; ++i) {
    absl::Notification done;
    pool.Schedule([&] { done.Notify(); });
    done.WaitForNotification();
  }
  // One task at a time: once the first thread is idle again it takes every
  // later task (a second may start while the first is between tasks).
  EXPECT_LE(pool.num_threads(), 2);
}

TEST(ThreadPoolTest, TasksThatWaitOnEachOtherDoNotDeadlock) {
  ThreadPool pool;
  constexpr int kTasks = 8;
  absl::BlockingCounter started(kTasks);
  absl::Notification release;
  absl::BlockingCounter finished(kTasks);
  for (int i = 0; i < kTasks; ++i) {
    pool.Schedule([&] {
      started.DecrementCount();
      release.WaitForNotification();
      finished.DecrementCount();
    });
  }
  started.Wait();  // all eight run at once: none waits for a thread
  EXPECT_EQ(pool.num_threads(), kTasks);
  release.Notify();
  finished.Wait();
}

TEST(ThreadPoolTest, DestructorRunsScheduledTasks) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool;
    for (int i = 0; i < 16; ++i) pool.Schedule([&] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 16);
}

}  // namespace
}  // namespace moesh
