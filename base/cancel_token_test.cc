#include "base/cancel_token.h"

#include <atomic>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace moesh {
namespace {

TEST(CancelTokenTest, CallbacksRunOnceInOrderOnCancel) {
  CancelToken token;
  std::vector<int> ran;
  CancelToken::Registration a = token.OnCancel([&] { ran.push_back(1); });
  CancelToken::Registration b = token.OnCancel([&] { ran.push_back(2); });
  EXPECT_FALSE(token.cancelled());
  EXPECT_TRUE(ran.empty());
  token.Cancel();
  token.Cancel();
  EXPECT_TRUE(token.cancelled());
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
}

TEST(CancelTokenTest, RegisteringOnACancelledTokenRunsAtOnce) {
  CancelToken token;
  token.Cancel();
  bool ran = false;
  CancelToken::Registration r = token.OnCancel([&] { ran = true; });
  EXPECT_TRUE(ran);
}

TEST(CancelTokenTest, ADroppedCallbackDoesNotRun) {
  CancelToken token;
  bool ran = false;
  {
    CancelToken::Registration r = token.OnCancel([&] { ran = true; });
  }
  CancelToken::Registration moved;
  {
    CancelToken::Registration r = token.OnCancel([&] { ran = true; });
    moved = std::move(r);
  }
  moved.Reset();
  token.Cancel();
  EXPECT_FALSE(ran);
}

TEST(CancelTokenTest, ACallbackMayDropItsOwnRegistration) {
  CancelToken token;
  CancelToken::Registration r;
  bool ran = false;
  r = token.OnCancel([&] {
    ran = true;
    r.Reset();  // no wait on its own thread
  });
  token.Cancel();
  EXPECT_TRUE(ran);
}

TEST(CancelTokenTest, DroppingWaitsForTheCallbackRunningOnAnotherThread) {
  CancelToken token;
  std::atomic<bool> started{false}, release{false}, finished{false};
  CancelToken::Registration r = token.OnCancel([&] {
    started = true;
    while (!release) std::this_thread::yield();
    finished = true;
  });
  std::thread canceller([&] { token.Cancel(); });
  while (!started) std::this_thread::yield();
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    release = true;
  });
  r.Reset();  // returns only once the callback did
  EXPECT_TRUE(finished);
  canceller.join();
  releaser.join();
}

}  // namespace
}  // namespace moesh
