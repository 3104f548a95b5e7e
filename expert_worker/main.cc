// moesh expert worker: hosts a shard of the routed experts and serves expert
// dispatch for every MoE layer over the data plane.
#include <iostream>
#include <memory>

#include "absl/flags/flag.h"
#include "common/backend/backends.h"
#include "common/base/status.h"
#include "common/metrics/metrics.h"
#include "common/model/config.h"
#include "common/model/safetensors.h"
#include "common/model/weights.h"
#include "common/rpc/grpc_util.h"
#include "common/service/device_flags.h"
#include "common/service/worker_flags.h"
#include "common/service/worker_main.h"
#include "common/transport/data_plane_endpoint.h"
#include "common/transport/grpc_data_plane_service.h"
#include "expert_worker/expert_service.h"

ABSL_FLAG(std::string, model, "", "Model directory (config.json + safetensors).");
ABSL_FLAG(std::string, experts, "", "Experts to host, e.g. \"0-31\" (default: all, or --shard).");
ABSL_FLAG(std::string, shard, "", "Host the i-th of n equal shards of the experts: \"i/n\".");
ABSL_FLAG(std::string, listen, "127.0.0.1:0", "host:port to serve on (port 0: pick a free one).");
ABSL_FLAG(std::string, advertise_host, "127.0.0.1", "Host name peers use to reach this worker.");
ABSL_FLAG(std::string, router, "", "Router address to register with (optional).");
ABSL_FLAG(std::string, ready_file, "", "Write host:port here once serving.");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:0",
          "host:port of the Prometheus /metrics endpoint (port 0: any free one; empty: none).");
ABSL_FLAG(std::string, transport, "grpc",
          "Data plane to serve besides gRPC: grpc (only), ucx, nccl or cuda_ipc (--device cuda).");
ABSL_FLAG(int, batch_window_us, 200,
          "How long a layer's first dispatch waits for other attention workers' dispatches to "
          "merge with it (skipped while only one dispatches).");

namespace moesh {
namespace {

absl::Status Run() {
  const std::string dir = absl::GetFlag(FLAGS_model);
  if (dir.empty()) return absl::InvalidArgumentError("--model is required");
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::Load(dir));
  ASSIGN_OR_RETURN(DeviceOptions device, DeviceOptionsFromFlags());
  std::unique_ptr<Checkpoint> ckpt;  // none with dummy weights: config.json is all there is
  if (!device.dummy_weights) {
    ASSIGN_OR_RETURN(ckpt, Checkpoint::Open(dir));
    RETURN_IF_ERROR(ValidateCheckpoint(config, *ckpt));
  }
  std::set<int> experts;
  if (!absl::GetFlag(FLAGS_experts).empty()) {
    ASSIGN_OR_RETURN(experts,
                     ParseExpertList(absl::GetFlag(FLAGS_experts), config.n_routed_experts));
  } else if (!absl::GetFlag(FLAGS_shard).empty()) {
    ASSIGN_OR_RETURN(experts, ExpertShard(absl::GetFlag(FLAGS_shard), config.n_routed_experts));
  }
  // The shard's weights, or (dummy) a placeholder the device fills. Replicas
  // the rebalancer places here come the same way.
  auto load = [&config, &ckpt](
                  const std::set<int>& ids) -> absl::StatusOr<std::unique_ptr<ExpertShardWeights>> {
    if (ckpt == nullptr) return ExpertShardWeights::Placeholder(config, ids);
    return ExpertShardWeights::Load(config, *ckpt, ids);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<ExpertShardWeights> weights, load(experts));
  const std::set<int> hosted = weights->expert_ids;
  ASSIGN_OR_RETURN(std::unique_ptr<Metrics> metrics,
                   Metrics::Create(absl::GetFlag(FLAGS_metrics_listen), "expert_worker"));
  const std::string metrics_address =
      metrics->port() > 0 ? absl::StrCat(absl::GetFlag(FLAGS_advertise_host), ":", metrics->port())
                          : "";
  ExpertServiceOptions options;
  options.metrics = metrics.get();
  options.loader = load;
  options.batch_window = std::chrono::microseconds(absl::GetFlag(FLAGS_batch_window_us));
  ASSIGN_OR_RETURN(std::unique_ptr<ExpertStage> stage,
                   MakeExpertStage(config, std::move(weights), device));
  const std::string where = stage->device();
  ExpertService service(std::move(stage), config.Fingerprint(), options);
  GrpcDataPlaneService data_plane(&service, nullptr);
  ASSIGN_OR_RETURN(RunningServer server,
                   StartGrpcServer(absl::GetFlag(FLAGS_listen), {&service, &data_plane}));
  const std::string address = absl::StrCat(absl::GetFlag(FLAGS_advertise_host), ":", server.port);
  int cuda_device = 0;
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport == "nccl" || transport == "cuda_ipc") {
    ASSIGN_OR_RETURN(cuda_device, CudaOrdinal(device.device, "--transport " + transport));
  }
  ASSIGN_OR_RETURN(DataPlaneEndpoint data,
                   StartDataPlane(transport, absl::GetFlag(FLAGS_advertise_host), address, &service,
                                  nullptr, cuda_device, &service));
  service.set_data_plane_address(data.address);
  std::cerr << "expert worker serving experts " << *hosted.begin() << ".." << *hosted.rbegin()
            << " (" << hosted.size() << ") of " << config.Fingerprint() << " on " << address << " ("
            << where << ", data plane " << absl::GetFlag(FLAGS_transport) << " " << data.address
            << ")" << std::endl;
  ServeOptions serve;
  serve.name = "expert worker";
  serve.router = absl::GetFlag(FLAGS_router);
  v1::RegisterRequest& reg = serve.registration;
  reg.set_kind(v1::WORKER_KIND_EXPERT);
  reg.set_address(address);
  reg.set_model_fingerprint(config.Fingerprint());
  reg.set_data_plane_address(data.address);
  for (int e : hosted) reg.add_expert_ids(e);
  serve.load = [&service] { return service.Load(); };
  serve.ready_file = absl::GetFlag(FLAGS_ready_file);
  serve.address = address;
  serve.metrics_address = metrics_address;
  return ServeUntilSignal(server.server.get(), serve);
}

}  // namespace
}  // namespace moesh

int main(int argc, char** argv) {
  return moesh::ServiceMain(
      argc, argv,
      "moesh expert worker: --model DIR [--shard i/n | --experts 0-3] [--router host:port]",
      "expert_worker", moesh::Run);
}
