// The doorbell under the cuda_ipc transport: calls between threads and
// between processes, and every way a call ends without a reply.
#include "common/transport/shm_doorbell.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

std::string Reverse(std::string s) { return std::string(s.rbegin(), s.rend()); }

// A doorbell, and the server's side of it opened by name in this process.
void CreateAndOpen(absl::StatusOr<std::unique_ptr<ShmDoorbell>>* client,
                   absl::StatusOr<std::unique_ptr<ShmDoorbell>>* server) {
  *client = ShmDoorbell::Create();
  ASSERT_TRUE(client->ok()) << client->status();
  *server = ShmDoorbell::Open((**client)->name());
  ASSERT_TRUE(server->ok()) << server->status();
}

TEST(ShmDoorbellTest, CallsBetweenThreadsGetTheirOwnReplies) {
  absl::StatusOr<std::unique_ptr<ShmDoorbell>> client, server;
  ASSERT_NO_FATAL_FAILURE(CreateAndOpen(&client, &server));
  std::atomic<bool> stop{false};
  std::thread serving([&] {
    while (true) {
      absl::StatusOr<std::string> r = (*server)->WaitRequest(&stop);
      if (!r.ok()) return;
      (*server)->Reply(Reverse(*r));
    }
  });
  for (int i = 0; i < 2000; ++i) {
    const std::string request = absl::StrCat("call ", i, std::string(i % 50, 'x'));
    ASSERT_TRUE((*client)->Post(request).ok());
    absl::StatusOr<std::string> reply =
        (*client)->WaitReply(absl::Now() + absl::Seconds(10), nullptr);
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(*reply, Reverse(request));
  }
  stop.store(true);
  serving.join();
}

TEST(ShmDoorbellTest, CallsBetweenProcesses) {
  auto client = ShmDoorbell::Create();
  ASSERT_TRUE(client.ok()) << client.status();
  const std::string name = (*client)->name();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the server: answers 500 calls, then exits
    auto server = ShmDoorbell::Open(name);
    if (!server.ok()) _exit(2);
    for (int i = 0; i < 500; ++i) {
      absl::StatusOr<std::string> r = (*server)->WaitRequest(nullptr);
      if (!r.ok()) _exit(3);
      (*server)->Reply(absl::StrCat(getpid(), ":", Reverse(*r)));
    }
    _exit(0);
  }
  for (int i = 0; i < 500; ++i) {
    const std::string request = absl::StrCat("layer ", i);
    ASSERT_TRUE((*client)->Post(request).ok());
    absl::StatusOr<std::string> reply =
        (*client)->WaitReply(absl::Now() + absl::Seconds(20), nullptr);
    ASSERT_TRUE(reply.ok()) << reply.status();
    ASSERT_EQ(*reply, absl::StrCat(child, ":", Reverse(request)));
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(ShmDoorbellTest, NoReplyEndsAtTheDeadlineOrOnAbort) {
  auto client = ShmDoorbell::Create();
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Post("nobody answers").ok());
  EXPECT_EQ((*client)->Post("again").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*client)->WaitReply(absl::Now() + absl::Milliseconds(30), nullptr).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  std::atomic<bool> abort{false};
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(20));
    abort.store(true);
  });
  EXPECT_EQ((*client)->WaitReply(absl::Now() + absl::Seconds(30), &abort).status().code(),
            absl::StatusCode::kUnavailable);
  aborter.join();
}

TEST(ShmDoorbellTest, StoppedServerAndBadInput) {
  absl::StatusOr<std::unique_ptr<ShmDoorbell>> client, server;
  ASSERT_NO_FATAL_FAILURE(CreateAndOpen(&client, &server));
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(20));
    stop.store(true);
  });
  EXPECT_EQ((*server)->WaitRequest(&stop).status().code(), absl::StatusCode::kCancelled);
  stopper.join();
  EXPECT_EQ((*client)->Post(std::string(ShmDoorbell::kMaxMessage + 1, 'x')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->WaitReply(absl::Now(), nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Once unlinked (the server has it), the name opens no more.
  const std::string name = (*client)->name();
  (*client)->Unlink();
  EXPECT_FALSE(ShmDoorbell::Open(name).ok());
  EXPECT_FALSE(ShmDoorbell::Open("/moesh-no-such-doorbell").ok());
}

}  // namespace
}  // namespace moesh
