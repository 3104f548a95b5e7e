// moesh bench --dispatch: the host wire's cost per --dispatch_dtype. One MoE
// layer's dispatch of --batch tokens x --hidden values (top-2 of 8 experts)
// goes through RemoteExpertClient to a data-plane server in this process on
// loopback (grpc: the DataPlane service; ucx: its listener) whose handler
// only echoes what it reads — no expert compute — so a row is the data
// plane alone: encode, send, decode, answer, decode. Each row prints the
// hidden-state bytes per token each way, the round trip's median over
// --reps calls, and the answer's largest error against the exact one
// relative to the largest value (fp32: 0), fp32 first as the same run's
// baseline. Then the fp8 codec alone (kernels/cpu/fp8.h, what the wire runs
// on each side): ns per value to encode (amax scale per 128 values and the
// e4m3 codes) and to decode to fp32, median of --reps.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/status.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "common/rpc/grpc_util.h"
#include "common/transport/dispatch_wire.h"
#include "common/transport/grpc_data_plane_service.h"
#include "common/transport/remote_expert_client.h"
#include "common/transport/ucx_transport.h"
#include "kernels/cpu/fp8.h"

ABSL_FLAG(bool, dispatch, false,
          "The host data plane's cost per --dispatch_dtype instead (fp32, bf16, fp8 over grpc "
          "and ucx on loopback, no expert compute: bench_dispatch.cc).");
ABSL_FLAG(int, hidden, 7168, "--dispatch: values per token (7168: DeepSeek-V3's hidden size).");
ABSL_FLAG(int, reps, 50, "--dispatch: timed round trips per row (after 5 untimed).");
ABSL_FLAG(std::string, transports, "grpc,ucx", "--dispatch: the transports, comma-separated.");
ABSL_DECLARE_FLAG(std::string, batch);

namespace moesh::cli {
namespace {

// Answers every dispatch with the hidden states it read (the widened fp32 of
// a bf16 or fp8 request).
class Echo : public DispatchHandler {
 public:
  absl::Status Dispatch(const MoeDispatch& d, float* out) override {
    std::memcpy(out, d.hidden_states, sizeof(float) * d.num_tokens * d.hidden);
    return absl::OkStatus();
  }
};

// A running data-plane server of `transport` on loopback.
struct LoopbackServer {
  RunningServer grpc;
  std::unique_ptr<GrpcDataPlaneService> service;
  std::unique_ptr<DataPlaneServer> listener;
  std::string address;
};

absl::StatusOr<LoopbackServer> Serve(const std::string& transport, Echo* handler) {
  LoopbackServer s;
  if (transport == "grpc") {
    s.service = std::make_unique<GrpcDataPlaneService>(handler, nullptr);
    ASSIGN_OR_RETURN(s.grpc, StartGrpcServer("127.0.0.1:0", {s.service.get()}));
    s.address = absl::StrCat("127.0.0.1:", s.grpc.port);
  } else if (transport == "ucx") {
    setenv("UCX_NET_DEVICES", "lo", 0);  // loopback only, unless the caller chose
    setenv("UCX_TLS", "tcp", 0);
    ASSIGN_OR_RETURN(s.listener, UcxDataPlaneServer::Start("127.0.0.1:0", handler, nullptr));
    s.address = absl::StrCat("127.0.0.1:", s.listener->port());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--transports: '", transport, "' (grpc or ucx: the host wire's transports)"));
  }
  return s;
}

// The median of `reps` timed calls of `f` (after 3 untimed), in ns.
template <typename F>
double MedianNs(int reps, F f) {
  std::vector<double> ns;
  for (int r = 0; r < reps + 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const auto t1 = std::chrono::steady_clock::now();
    if (r >= 3) ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
  }
  std::nth_element(ns.begin(), ns.begin() + ns.size() / 2, ns.end());
  return ns[ns.size() / 2];
}

absl::Status Fp8CodecBench(const std::vector<int64_t>& batches, int hidden, int reps) {
  std::printf("\nfp8 codec alone (kernels/cpu/fp8.h): ns per value, median of %d\n", reps);
  std::printf("%7s %14s %14s\n", "tokens", "encode ns/val", "decode ns/val");
  for (const int64_t tokens : batches) {
    const size_t n = static_cast<size_t>(tokens) * hidden;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> h(n), back(n);
    for (float& x : h) x = normal(rng);
    std::vector<uint8_t> q(n);
    std::vector<float> scale(static_cast<size_t>(tokens) * cpu::Fp8Blocks(hidden));
    const int m = static_cast<int>(tokens);
    const double enc =
        MedianNs(reps, [&] { cpu::QuantizeFp8Rows(h.data(), q.data(), scale.data(), m, hidden); });
    const double dec = MedianNs(
        reps, [&] { cpu::DequantizeFp8Rows(q.data(), scale.data(), back.data(), m, hidden); });
    float err = 0, amax = 0;
    for (size_t i = 0; i < n; ++i) {
      err = std::max(err, std::fabs(back[i] - h[i]));
      amax = std::max(amax, std::fabs(h[i]));
    }
    if (!(err <= amax / 8)) return absl::InternalError("fp8 codec bench: the round trip is wrong");
    std::printf("%7lld %14.3f %14.3f\n", static_cast<long long>(tokens), enc / n, dec / n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunDispatchBench() {
  ASSIGN_OR_RETURN(const std::vector<int64_t> batches,
                   ParseIntList("batch", absl::GetFlag(FLAGS_batch)));
  const int hidden = absl::GetFlag(FLAGS_hidden), reps = absl::GetFlag(FLAGS_reps);
  if (hidden < 1 || reps < 1) return absl::InvalidArgumentError("--hidden and --reps must be >= 1");
  constexpr int kExperts = 8, kTopK = 2;
  std::printf("data plane alone on loopback: hidden %d, top-%d of %d experts, median of %d calls\n",
              hidden, kTopK, kExperts, reps);
  std::printf("%-5s %-5s %7s %14s %14s %12s %10s %12s\n", "wire", "dtype", "tokens",
              "bytes/tok out", "bytes/tok back", "median ms", "vs fp32", "max rel err");
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_transports), ',')) {
    const std::string transport_name(name);
    Echo handler;
    ASSIGN_OR_RETURN(LoopbackServer server, Serve(transport_name, &handler));
    ASSIGN_OR_RETURN(std::unique_ptr<Transport> transport, MakeTransport(transport_name));
    ExpertPlacement placement;
    for (int e = 0; e < kExperts; ++e) placement[server.address].push_back(e);
    for (const int64_t tokens : batches) {
      if (tokens < 1) return absl::InvalidArgumentError("--batch sizes must be >= 1");
      std::mt19937 rng(7);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> h(static_cast<size_t>(tokens) * hidden), weights(tokens * kTopK, 0.5f),
          out(h.size());
      for (float& x : h) x = normal(rng);
      std::vector<int32_t> ids(tokens * kTopK);
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % kExperts);
      MoeDispatch d;
      d.layer = 1, d.num_tokens = static_cast<int>(tokens), d.hidden = hidden, d.top_k = kTopK;
      d.hidden_states = h.data(), d.topk_ids = ids.data(), d.topk_weights = weights.data();
      double fp32_ms = 0;
      for (const char* dtype : {"fp32", "bf16", "fp8"}) {
        ASSIGN_OR_RETURN(const DispatchWire wire, ParseDispatchDType(dtype));
        ASSIGN_OR_RETURN(std::unique_ptr<RemoteExpertClient> client,
                         RemoteExpertClient::Create(transport.get(), placement, kExperts,
                                                    std::chrono::seconds(5), nullptr, wire));
        std::vector<double> ms;
        for (int r = 0; r < reps + 5; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          RETURN_IF_ERROR(client->Run(d, out.data()));
          const auto t1 = std::chrono::steady_clock::now();
          if (r >= 5) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
        std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
        const double median = ms[ms.size() / 2];
        if (fp32_ms == 0) fp32_ms = median;
        float err = 0, amax = 0;
        for (size_t i = 0; i < h.size(); ++i) {
          err = std::max(err, std::fabs(out[i] - h[i]));
          amax = std::max(amax, std::fabs(h[i]));
        }
        std::printf("%-5s %-5s %7lld %14zu %14zu %12.3f %9.2fx %12.2e\n", transport_name.c_str(),
                    dtype, static_cast<long long>(tokens), WireHiddenBytes(wire.hidden, 1, hidden),
                    WireHiddenBytes(wire.reply, 1, hidden), median, median / fp32_ms, err / amax);
      }
    }
    if (server.grpc.server != nullptr) server.grpc.server->Shutdown();
  }
  return Fp8CodecBench(batches, hidden, reps);
}

}  // namespace moesh::cli
