// The transport registry: names, capabilities, and each plugin's two sides
// where they run without a GPU (grpc, inproc, ucx).
#include "common/transport/transport_registry.h"

#include "common/transport/data_plane_endpoint.h"
#include "gtest/gtest.h"

namespace moesh {
namespace {

TEST(TransportRegistryTest, FindsEveryBuiltInAndNamesTheChoicesOtherwise) {
  for (const char* name : {"grpc", "inproc", "ucx", "nccl", "cuda_ipc"}) {
    absl::StatusOr<const TransportPlugin*> p = FindTransport(name);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ((*p)->name(), name);
  }
  absl::StatusOr<const TransportPlugin*> bad = FindTransport("carrier-pigeon");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("grpc, inproc, ucx, nccl, cuda_ipc"), std::string::npos)
      << bad.status();
  EXPECT_EQ(MakeTransport("carrier-pigeon").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TransportRegistryTest, CapabilitiesSayWhatCallersDecideBy) {
  for (const char* name : {"grpc", "inproc", "ucx"}) {
    const TransportCapabilities c = (*FindTransport(name))->capabilities();
    EXPECT_FALSE(c.device_dispatch) << name;
    EXPECT_TRUE(c.carries_kv) << name;
    EXPECT_FALSE(c.device_kv) << name;
  }
  for (const char* name : {"nccl", "cuda_ipc"}) {
    const TransportCapabilities c = (*FindTransport(name))->capabilities();
    EXPECT_TRUE(c.device_dispatch) << name;
    EXPECT_FALSE(c.carries_kv) << name;
    EXPECT_TRUE(c.device_kv) << name;
  }
}

TEST(TransportRegistryTest, ServeSides) {
  // grpc rides on the worker's gRPC server.
  absl::StatusOr<DataPlaneEndpoint> grpc =
      StartDataPlane("grpc", "127.0.0.1", "127.0.0.1:7", nullptr, nullptr);
  ASSERT_TRUE(grpc.ok()) << grpc.status();
  EXPECT_EQ(grpc->address, "127.0.0.1:7");
  EXPECT_EQ(grpc->server, nullptr);
  // inproc has no server side.
  EXPECT_EQ(StartDataPlane("inproc", "127.0.0.1", "127.0.0.1:7", nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  // A KV-only worker (no dispatch handler) keeps its gRPC address on the device transports.
  for (const char* name : {"nccl", "cuda_ipc"}) {
    absl::StatusOr<DataPlaneEndpoint> e =
        StartDataPlane(name, "127.0.0.1", "127.0.0.1:7", nullptr, nullptr);
    ASSERT_TRUE(e.ok()) << name << ": " << e.status();
    EXPECT_EQ(e->address, "127.0.0.1:7") << name;
  }
}

}  // namespace
}  // namespace moesh
