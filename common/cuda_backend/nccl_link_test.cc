// The NCCL link: id round trip and error paths everywhere; the two-GPU
// exchange where two GPUs exist (skipped, with a message, elsewhere).
#include "common/cuda_backend/nccl_link.h"

#include <cstdlib>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace moesh {
namespace {

int GpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

TEST(NcclLinkTest, UniqueIdBytesRoundTripAndRejectGarbage) {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  absl::StatusOr<ncclUniqueId> id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  const std::string bytes = UniqueIdToBytes(*id);
  absl::StatusOr<ncclUniqueId> back = UniqueIdFromBytes(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(UniqueIdToBytes(*back), bytes);
  EXPECT_EQ(UniqueIdFromBytes("short").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(NcclLinkTest, BadArgumentsAndMissingGpusAreErrorsNotCrashes) {
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  absl::StatusOr<ncclUniqueId> id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(NcclLink::Create(*id, 2, 0).status().code(), absl::StatusCode::kInvalidArgument);
  if (GpuCount() == 0) {
    EXPECT_EQ(NcclLink::Create(*id, 0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  } else {
    EXPECT_EQ(NcclLink::Create(*id, 0, 999).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(NcclLinkTest, TwoGpusExchangeBuffersBothWays) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs (found " << GpuCount() << "): skipped";
  setenv("NCCL_SOCKET_IFNAME", "lo", 1);
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  absl::StatusOr<ncclUniqueId> id = NewNcclUniqueId();
  ASSERT_TRUE(id.ok());
  constexpr size_t kBytes = 8 << 20;
  std::vector<std::vector<unsigned char>> got(2, std::vector<unsigned char>(kBytes));
  std::vector<absl::Status> status(2);
  auto rank_main = [&](int rank) {
    absl::StatusOr<std::unique_ptr<NcclLink>> link = NcclLink::Create(*id, rank, rank);
    if (!link.ok()) {
      status[rank] = link.status();
      return;
    }
    std::vector<unsigned char> mine(kBytes);
    for (size_t i = 0; i < kBytes; ++i) mine[i] = static_cast<unsigned char>(i * 7 + rank * 13);
    void *send = nullptr, *recv = nullptr;
    cudaMalloc(&send, kBytes);
    cudaMalloc(&recv, kBytes);
    cudaMemcpy(send, mine.data(), kBytes, cudaMemcpyHostToDevice);
    cudaMemset(recv, 0xff, kBytes);
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    // Both ways at once: one group (two separate calls would each wait
    // for the other side's matching one).
    const NcclLink::Buffer out[] = {{send, kBytes}}, in[] = {{recv, kBytes}};
    absl::Status s = (*link)->Group(out, 1, in, 1, stream, absl::Now() + absl::Seconds(60));
    if (s.ok()) s = (*link)->Wait(stream, absl::Now() + absl::Seconds(60));
    cudaMemcpy(got[rank].data(), recv, kBytes, cudaMemcpyDeviceToHost);
    cudaStreamDestroy(stream);
    cudaFree(send);
    cudaFree(recv);
    status[rank] = s;
  };
  std::thread r0(rank_main, 0), r1(rank_main, 1);
  r0.join();
  r1.join();
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
  for (int rank = 0; rank < 2; ++rank) {
    const int peer = 1 - rank;
    for (size_t i = 0; i < kBytes; i += 4099) {
      ASSERT_EQ(got[rank][i], static_cast<unsigned char>(i * 7 + peer * 13))
          << "rank " << rank << " byte " << i;
    }
  }
}

}  // namespace
}  // namespace moesh
