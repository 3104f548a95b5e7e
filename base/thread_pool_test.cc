#include "base/thread_pool.h"

#include <atomic>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

TEST(ThreadPoolTest, ReusesIdleThreads) {
  ThreadPool pool;
  for (int i = 0; i < 20; ++i) {
    absl::Notification done;
    pool.Schedule([&] { done.Notify(); });
    done.WaitForNotification();
    // Once its thread waits again, the next task takes it: no new thread.
    while (pool.num_idle() < pool.num_threads()) absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(pool.num_threads(), 1);
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
