#include "common/transport/shm_doorbell.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MOESH_CPU_RELAX() _mm_pause()
#else
#define MOESH_CPU_RELAX() ((void)0)
#endif

namespace moesh {

struct ShmDoorbell::Block {
  static constexpr uint64_t kMagic = 0x6d6f657368646231ull;  // "moeshdb1"
  uint64_t magic;
  alignas(64) std::atomic<uint64_t> posted;   // written by the client
  alignas(64) std::atomic<uint64_t> replied;  // written by the server
  alignas(64) uint32_t request_size;
  uint32_t reply_size;
  char request[kMaxMessage];
  char reply[kMaxMessage];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "the doorbell needs lock-free 64-bit atomics");

namespace {

// Waits until `ready()`: spins for 50 µs, yields until 2 ms, then sleeps,
// each sleep twice the last, from 50 µs up to 1 ms (an idle waiter wakes
// about a thousand times a second). `give_up()` is polled throughout.
template <typename Ready, typename GiveUp>
bool Await(Ready ready, GiveUp give_up) {
  const auto start = std::chrono::steady_clock::now();
  auto nap = std::chrono::microseconds(50);
  for (uint64_t i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 63) != 0 && nap == std::chrono::microseconds(50)) {
      MOESH_CPU_RELAX();
      continue;
    }
    if (give_up()) return false;
    const auto waited = std::chrono::steady_clock::now() - start;
    if (waited < std::chrono::microseconds(50)) {
      MOESH_CPU_RELAX();
    } else if (waited < std::chrono::milliseconds(2)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
  }
}

absl::Status Errno(absl::string_view what, const std::string& name) {
  return absl::UnavailableError(absl::StrCat(what, " ", name, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShmDoorbell>> ShmDoorbell::Create() {
  // A random name: processes in other PID namespaces may share /dev/shm.
  static std::atomic<uint64_t> counter{std::random_device{}() ^
                                       (static_cast<uint64_t>(getpid()) << 32)};
  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    name = absl::StrCat("/moesh-doorbell-", getpid(), "-",
                        absl::Hex(counter.fetch_add(0x9e3779b97f4a7c15ull)));
    fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return Errno("shm_open", name);
  if (ftruncate(fd, sizeof(Block)) != 0) {
    absl::Status s = Errno("ftruncate", name);
    close(fd);
    shm_unlink(name.c_str());
    return s;
  }
  void* p = mmap(nullptr, sizeof(Block), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    absl::Status s = Errno("mmap", name);
    shm_unlink(name.c_str());
    return s;
  }
  Block* b = new (p) Block();  // the segment starts zeroed; this sets up the atomics
  b->posted.store(0);
  b->replied.store(0);
  b->magic = Block::kMagic;
  return std::unique_ptr<ShmDoorbell>(new ShmDoorbell(name, b, true));
}

absl::StatusOr<std::unique_ptr<ShmDoorbell>> ShmDoorbell::Open(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return Errno("shm_open", name);
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != sizeof(Block)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(name, " is not a moesh doorbell (wrong size)"));
  }
  void* p = mmap(nullptr, sizeof(Block), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return Errno("mmap", name);
  Block* b = static_cast<Block*>(p);
  if (b->magic != Block::kMagic) {
    munmap(p, sizeof(Block));
    return absl::InvalidArgumentError(absl::StrCat(name, " is not a moesh doorbell"));
  }
  std::unique_ptr<ShmDoorbell> d(new ShmDoorbell(name, b, false));
  d->seq_ =
      b->replied.load(std::memory_order_acquire);  // a request posted before Open is served too
  return d;
}

ShmDoorbell::~ShmDoorbell() {
  Unlink();
  munmap(block_, sizeof(Block));
}

void ShmDoorbell::Unlink() {
  if (owner_) shm_unlink(name_.c_str());
  owner_ = false;
}

absl::Status ShmDoorbell::Post(absl::string_view request) {
  if (request.size() > kMaxMessage) {
    return absl::InvalidArgumentError(absl::StrCat("a doorbell request of ", request.size(),
                                                   " bytes (at most ", kMaxMessage, ")"));
  }
  if (outstanding_) return absl::FailedPreconditionError("a doorbell call is already outstanding");
  std::memcpy(block_->request, request.data(), request.size());
  block_->request_size = static_cast<uint32_t>(request.size());
  outstanding_ = true;
  block_->posted.store(++seq_, std::memory_order_release);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ShmDoorbell::WaitReply(absl::Time deadline,
                                                   const std::atomic<bool>* abort) {
  if (!outstanding_) return absl::FailedPreconditionError("no doorbell call is outstanding");
  const uint64_t want = seq_;
  bool timed_out = false;
  const bool done = Await([&] { return block_->replied.load(std::memory_order_acquire) == want; },
                          [&] {
                            if (abort != nullptr && abort->load(std::memory_order_relaxed))
                              return true;
                            timed_out = absl::Now() > deadline;
                            return timed_out;
                          });
  if (!done) {
    return timed_out ? absl::DeadlineExceededError("no reply on the doorbell before the deadline")
                     : absl::UnavailableError("the peer went away");
  }
  outstanding_ = false;
  const uint32_t n = std::min<uint32_t>(block_->reply_size, kMaxMessage);
  return std::string(block_->reply, n);
}

absl::StatusOr<std::string> ShmDoorbell::WaitRequest(const std::atomic<bool>* stop) {
  const bool got = Await([&] { return block_->posted.load(std::memory_order_acquire) > seq_; },
                         [&] { return stop != nullptr && stop->load(std::memory_order_relaxed); });
  if (!got) return absl::CancelledError("the doorbell was stopped");
  seq_ = block_->posted.load(std::memory_order_acquire);
  const uint32_t n = std::min<uint32_t>(block_->request_size, kMaxMessage);
  return std::string(block_->request, n);
}

void ShmDoorbell::Reply(absl::string_view reply) {
  const size_t n = std::min(reply.size(), kMaxMessage);
  std::memcpy(block_->reply, reply.data(), n);
  block_->reply_size = static_cast<uint32_t>(n);
  block_->replied.store(seq_, std::memory_order_release);
}

}  // namespace moesh
