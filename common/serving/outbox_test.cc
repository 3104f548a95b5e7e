// Outbox: what one reader takes of what the engine pushed, and when it wakes.
#include "common/serving/outbox.h"

#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

TokenEvent Event(int32_t id, bool finished = false) {
  TokenEvent e;
  e.ids.push_back(id);
  e.finished = finished;
  return e;
}

TEST(OutboxTest, TakesEverythingPushedInOrderThenTheEnd) {
  Outbox box;
  box.Push(Event(1));
  box.Push(Event(2));
  bool closed = true;
  std::deque<TokenEvent> got = box.Take(&closed);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].ids[0], 1);
  EXPECT_EQ(got[1].ids[0], 2);
  EXPECT_FALSE(closed);
  // Events pushed before Close still come, with the end.
  box.Push(Event(3, true));
  box.Close();
  got = box.Take(&closed);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].ids[0], 3);
  EXPECT_TRUE(got[0].finished);
  EXPECT_TRUE(closed);
  // Closed and drained: Take returns at once, empty.
  got = box.Take(&closed);
  EXPECT_TRUE(got.empty());
  EXPECT_TRUE(closed);
}

TEST(OutboxTest, AWaitingReaderWakesOnPushAndOnClose) {
  Outbox box;
  absl::Notification took_first;
  std::vector<int32_t> seen;
  bool closed_seen = false;
  std::thread reader([&] {
    for (bool closed = false; !closed;) {
      for (const TokenEvent& e : box.Take(&closed)) seen.push_back(e.ids[0]);
      if (!took_first.HasBeenNotified() && !seen.empty()) took_first.Notify();
      closed_seen = closed;
    }
  });
  box.Push(Event(7));
  took_first.WaitForNotification();  // the reader was woken by the push alone
  box.Close();                       // and is woken again by the end, with nothing to take
  reader.join();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], 7);
  EXPECT_TRUE(closed_seen);
}

}  // namespace
}  // namespace moesh
