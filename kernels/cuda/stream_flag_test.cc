// Device-side flags (stream_flag.h): a wait holds its stream until another
// stream writes the word; the same protocol captured into two CUDA graphs and
// replayed step after step with constant values.
#include "kernels/cuda/stream_flag.h"

#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/test_util.h"

namespace moesh::cuda {
namespace {

constexpr absl::Duration kBound = absl::Seconds(10);

TEST(StreamFlagArgsTest, NullOrMisalignedWordIsInvalidArgument) {
  EXPECT_EQ(StreamWriteFlag(nullptr, nullptr, 1).code(), absl::StatusCode::kInvalidArgument);
  uint32_t words[2];
  uint32_t* odd = reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(words) + 2);
  EXPECT_EQ(StreamWaitFlag(nullptr, odd, 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StreamFlagTest, WaitHoldsTheStreamUntilAnotherStreamWrites) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(auto flag, DeviceBuffer<uint32_t>::Create(1));
  MOESH_ASSERT_OK_AND_ASSIGN(auto src, testing::Upload(std::vector<int32_t>{7, -3, 11, 42}));
  MOESH_ASSERT_OK_AND_ASSIGN(auto x, DeviceBuffer<int32_t>::Create(4));
  MOESH_ASSERT_OK_AND_ASSIGN(auto y, DeviceBuffer<int32_t>::Create(4));
  MOESH_ASSERT_OK_AND_ASSIGN(Stream a, Stream::Create());
  MOESH_ASSERT_OK_AND_ASSIGN(Stream b, Stream::Create());
  ASSERT_EQ(cudaMemset(flag.get(), 0, sizeof(uint32_t)), cudaSuccess);
  ASSERT_EQ(cudaMemset(x.get(), 0, 4 * sizeof(int32_t)), cudaSuccess);
  MOESH_ASSERT_OK(StreamWaitFlag(b.get(), flag.get(), 1));
  ASSERT_EQ(
      cudaMemcpyAsync(y.get(), x.get(), 4 * sizeof(int32_t), cudaMemcpyDeviceToDevice, b.get()),
      cudaSuccess);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cudaStreamQuery(b.get()), cudaErrorNotReady) << "the wait did not hold stream b";
  ASSERT_EQ(
      cudaMemcpyAsync(x.get(), src.get(), 4 * sizeof(int32_t), cudaMemcpyDeviceToDevice, a.get()),
      cudaSuccess);
  MOESH_ASSERT_OK(StreamWriteFlag(a.get(), flag.get(), 1));
  MOESH_ASSERT_OK(SyncWithin(b.get(), kBound));
  MOESH_ASSERT_OK(SyncWithin(a.get(), kBound));
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, y.ToHost());
  EXPECT_EQ(got, (std::vector<int32_t>{7, -3, 11, 42}));  // x as stream a left it
}

TEST(StreamFlagTest, SyncWithinReportsAStreamBlockedOnAnUnwrittenWord) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(auto flag, DeviceBuffer<uint32_t>::Create(1));
  MOESH_ASSERT_OK_AND_ASSIGN(Stream a, Stream::Create());
  MOESH_ASSERT_OK_AND_ASSIGN(Stream b, Stream::Create());
  ASSERT_EQ(cudaMemset(flag.get(), 0, sizeof(uint32_t)), cudaSuccess);
  MOESH_ASSERT_OK(StreamWaitFlag(b.get(), flag.get(), 5));
  EXPECT_EQ(SyncWithin(b.get(), absl::Milliseconds(100)).code(),
            absl::StatusCode::kDeadlineExceeded);
  // Giving up on the peer: the waiter's owner writes the word itself.
  MOESH_ASSERT_OK(StreamWriteFlag(a.get(), flag.get(), 5));
  MOESH_ASSERT_OK(SyncWithin(b.get(), kBound));
}

// Graph capture of one stream's work; the instantiated graph and the graph
// freed by the holder.
struct CapturedGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~CapturedGraph() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
};

// A producer and a consumer stream, each replaying its own graph once a step,
// hand a value over through device flags with constant values: the producer
// copies the step's input to x, raises `ready` and waits for `done`; the
// consumer waits for `ready`, lowers it, copies x to y and raises `done`; the
// producer lowers `done` and copies y out. Twenty steps, each checked.
TEST(StreamFlagTest, CapturedPingPongReplaysStepAfterStep) {
  MOESH_REQUIRE_GPU();
  MOESH_ASSERT_OK_AND_ASSIGN(auto flags, DeviceBuffer<uint32_t>::Create(2));
  uint32_t* ready = flags.get();
  uint32_t* done = flags.get() + 1;
  MOESH_ASSERT_OK_AND_ASSIGN(auto in, DeviceBuffer<int32_t>::Create(1));
  MOESH_ASSERT_OK_AND_ASSIGN(auto x, DeviceBuffer<int32_t>::Create(1));
  MOESH_ASSERT_OK_AND_ASSIGN(auto y, DeviceBuffer<int32_t>::Create(1));
  MOESH_ASSERT_OK_AND_ASSIGN(auto out, DeviceBuffer<int32_t>::Create(1));
  MOESH_ASSERT_OK_AND_ASSIGN(Stream a, Stream::Create());
  MOESH_ASSERT_OK_AND_ASSIGN(Stream b, Stream::Create());
  ASSERT_EQ(cudaMemset(flags.get(), 0, 2 * sizeof(uint32_t)), cudaSuccess);

  CapturedGraph producer, consumer;
  ASSERT_EQ(cudaStreamBeginCapture(a.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(x.get(), in.get(), sizeof(int32_t), cudaMemcpyDeviceToDevice, a.get()),
            cudaSuccess);
  MOESH_ASSERT_OK(StreamWriteFlag(a.get(), ready, 1));
  MOESH_ASSERT_OK(StreamWaitFlag(a.get(), done, 1));
  MOESH_ASSERT_OK(StreamWriteFlag(a.get(), done, 0));
  ASSERT_EQ(cudaMemcpyAsync(out.get(), y.get(), sizeof(int32_t), cudaMemcpyDeviceToDevice, a.get()),
            cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(a.get(), &producer.graph), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(b.get(), cudaStreamCaptureModeThreadLocal), cudaSuccess);
  MOESH_ASSERT_OK(StreamWaitFlag(b.get(), ready, 1));
  MOESH_ASSERT_OK(StreamWriteFlag(b.get(), ready, 0));
  ASSERT_EQ(cudaMemcpyAsync(y.get(), x.get(), sizeof(int32_t), cudaMemcpyDeviceToDevice, b.get()),
            cudaSuccess);
  MOESH_ASSERT_OK(StreamWriteFlag(b.get(), done, 1));
  ASSERT_EQ(cudaStreamEndCapture(b.get(), &consumer.graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&producer.exec, producer.graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&consumer.exec, consumer.graph, 0), cudaSuccess);

  for (int step = 1; step <= 20; ++step) {
    const int32_t v = step * 13 - 100;
    ASSERT_EQ(cudaMemcpyAsync(in.get(), &v, sizeof(v), cudaMemcpyHostToDevice, a.get()),
              cudaSuccess);
    // The consumer first on odd steps, the producer first on even ones.
    if (step % 2) {
      ASSERT_EQ(cudaGraphLaunch(consumer.exec, b.get()), cudaSuccess);
    }
    ASSERT_EQ(cudaGraphLaunch(producer.exec, a.get()), cudaSuccess);
    if (step % 2 == 0) {
      ASSERT_EQ(cudaGraphLaunch(consumer.exec, b.get()), cudaSuccess);
    }
    SCOPED_TRACE(::testing::Message() << "step " << step);
    MOESH_ASSERT_OK(SyncWithin(a.get(), kBound));
    MOESH_ASSERT_OK(SyncWithin(b.get(), kBound));
    MOESH_ASSERT_OK_AND_ASSIGN(std::vector<int32_t> got, out.ToHost());
    ASSERT_EQ(got[0], v) << "step " << step;
  }
  MOESH_ASSERT_OK_AND_ASSIGN(std::vector<uint32_t> left, flags.ToHost());
  EXPECT_EQ(left, (std::vector<uint32_t>{0, 0})) << "each waiter lowers what it waited for";
}

}  // namespace
}  // namespace moesh::cuda
